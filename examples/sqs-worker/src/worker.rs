//! The SQS worker: long-poll, run each received batch through taskfence's
//! runtime (one claim for the whole batch), keep each message hidden while its
//! lease is renewed, act on each message's disposition as soon as its task
//! settles (delete only after the durable save), and on shutdown finish or
//! release what it holds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::runtime::{AckReason, Disposition, LeaseHooks, LeaveReason, RetryReason, WorkContext, Worker};
use taskfence::{Failure, Fenced, Lease, Response, TaskId, TaskStore};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use crate::provider::{Provider, ProviderError, ProviderRequest};
use crate::queue::{Delivery, SqsQueue};

/// Counters a worker fleet shares: what the queue delivered and what was done
/// with each delivery.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages received (every redelivery counts).
    pub deliveries: AtomicU64,
    /// Visibility extensions made by the lease hooks.
    pub extensions: AtomicU64,
    /// Visibility extensions SQS refused or that failed.
    pub extension_errors: AtomicU64,
    /// Deliveries of a message that this fleet was still handling: a visibility
    /// timeout ran out mid-work. Zero when the extensions keep up.
    pub redelivered_in_flight: AtomicU64,
    /// Deliveries whose handling failed on a store error (message left).
    pub store_errors: AtomicU64,
    /// Messages whose body is not a task id (deleted).
    pub malformed: AtomicU64,
    dispositions: Mutex<BTreeMap<&'static str, u64>>,
    saved_by_task: Mutex<HashMap<TaskId, u32>>,
    in_flight: Mutex<HashSet<String>>,
}

impl Stats {
    /// Count of each disposition, by name (`ack.completed`, `retry.busy`,
    /// `leave.lease_lost`…), and of each release at shutdown
    /// (`release.released`, `release.rejected`).
    pub fn dispositions(&self) -> BTreeMap<&'static str, u64> {
        self.dispositions.lock().unwrap().clone()
    }

    /// How many times each task's response was saved by this fleet (must be 1).
    pub fn saved_by_task(&self) -> HashMap<TaskId, u32> {
        self.saved_by_task.lock().unwrap().clone()
    }

    fn count_name(&self, name: &'static str) {
        *self.dispositions.lock().unwrap().entry(name).or_default() += 1;
    }

    fn count(&self, d: &Disposition, task: TaskId) {
        let name = match d {
            Disposition::Ack(AckReason::Completed) => "ack.completed",
            Disposition::Ack(AckReason::AlreadyCompleted) => "ack.already_completed",
            Disposition::Ack(AckReason::CompletedElsewhere) => "ack.completed_elsewhere",
            Disposition::Ack(AckReason::Failed) => "ack.failed",
            Disposition::Ack(AckReason::Cancelled) => "ack.cancelled",
            Disposition::Ack(AckReason::NotFound) => "ack.not_found",
            Disposition::Ack(_) => "ack.other",
            Disposition::RetryAfter {
                reason: RetryReason::Busy,
                ..
            } => "retry.busy",
            Disposition::RetryAfter {
                reason: RetryReason::Backoff,
                ..
            } => "retry.backoff",
            Disposition::RetryAfter {
                reason: RetryReason::Scheduled { .. },
                ..
            } => "retry.scheduled",
            Disposition::RetryAfter { .. } => "retry.other",
            Disposition::Leave(LeaveReason::LeaseLost(_)) => "leave.lease_lost",
            Disposition::Leave(LeaveReason::Rejected(_)) => "leave.rejected",
            Disposition::Leave(_) => "leave.other",
        };
        self.count_name(name);
        if *d == Disposition::Ack(AckReason::Completed) {
            *self.saved_by_task.lock().unwrap().entry(task).or_default() += 1;
        }
    }

    /// Marks `message_id` as being handled until the guard drops (also when the
    /// handling future is aborted).
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

struct InFlight {
    stats: Arc<Stats>,
    message_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.stats.in_flight.lock().unwrap().remove(&self.message_id);
    }
}

/// How one worker polls and hides messages.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Messages handled at once by this worker.
    pub concurrency: usize,
    /// Long-poll wait of each receive (at most 20 s).
    pub poll_wait: Duration,
    /// How long past the lease a held message stays hidden. When the worker
    /// dies, the message reappears about `lease + slack` later, when the lease
    /// has expired and a new claim can take over.
    pub visibility_slack: Duration,
    /// After shutdown is asked for, how long the messages in hand may take to
    /// finish. Tasks still being worked on then are released
    /// ([`TaskStore::release`]: pending again, the attempt counted) and their
    /// messages made visible at once, for another worker.
    pub shutdown_grace: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            poll_wait: Duration::from_secs(1),
            visibility_slack: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(25),
        }
    }
}

/// An SQS consumer running every message through a taskfence [`Worker`].
#[derive(Clone)]
pub struct SqsWorker {
    queue: SqsQueue,
    worker: Worker,
    store: Arc<dyn TaskStore>,
    provider: Arc<dyn Provider>,
    settings: WorkerSettings,
    stats: Arc<Stats>,
}

impl SqsWorker {
    /// A consumer of `queue` that claims with `worker` and calls `provider`.
    /// `store` is the store `worker` runs on: the consumer releases the
    /// leases it still holds at the end of a shutdown through it.
    pub fn new(
        queue: SqsQueue,
        worker: Worker,
        store: Arc<dyn TaskStore>,
        provider: Arc<dyn Provider>,
        settings: WorkerSettings,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            queue,
            worker,
            store,
            provider,
            settings,
            stats,
        }
    }

    /// Polls until `shutdown` turns true, then stops receiving and lets the
    /// messages in hand finish for up to [`WorkerSettings::shutdown_grace`];
    /// the tasks still being worked on then are released and their messages
    /// made visible again. Dropping this future instead is a crash: every
    /// message in hand is abandoned mid-flight (no save, no delete) and comes
    /// back when its lease and visibility run out.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // Turned true when the grace is over: the handlers park their work and
        // release their leases.
        let (release_tx, release_rx) = watch::channel(false);
        let slots = Arc::new(Semaphore::new(self.settings.concurrency.max(1)));
        let mut in_hand = JoinSet::new();
        let this = Arc::new(self);
        loop {
            while let Some(done) = in_hand.try_join_next() {
                if let Err(e) = done {
                    tracing::error!(error = %e, "message handler panicked");
                }
            }
            // Receive only as many messages as we can start now: a message that
            // waits in our hands keeps running down its visibility timeout.
            let first = tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => permit.expect("never closed"),
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let mut permits = vec![first];
            while permits.len() < 10 {
                match Arc::clone(&slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // A receive abandoned here may already have taken messages: they
            // stay hidden for the queue's visibility timeout and then come back.
            let received = tokio::select! {
                r = this.queue.receive(permits.len() as i32, this.settings.poll_wait) => r,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let deliveries = match received {
                Ok(d) => d,
                Err(error) => {
                    tracing::warn!(%error, "receive failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            // One claim round trip for the receive: every message with a task
            // id not seen yet in this receive joins the batch. A message that
            // is not a task id, or a second copy of a task in the same receive
            // (the batch needs distinct ids), is handled on its own, as it
            // would be if it came in another receive.
            let (mut batch, mut seen) = (Vec::new(), HashSet::new());
            for (delivery, permit) in deliveries.into_iter().zip(permits) {
                let (this, release) = (Arc::clone(&this), release_rx.clone());
                match delivery.task_id() {
                    Some(task_id) if seen.insert(task_id) => batch.push((delivery, permit)),
                    Some(_) => {
                        in_hand.spawn(async move { this.handle(vec![(delivery, permit)], release).await });
                    }
                    None => {
                        in_hand.spawn(async move {
                            this.drop_malformed(delivery).await;
                            drop(permit);
                        });
                    }
                }
            }
            if !batch.is_empty() {
                let (this, release) = (Arc::clone(&this), release_rx.clone());
                in_hand.spawn(async move { this.handle(batch, release).await });
            }
        }
        let grace = this.settings.shutdown_grace;
        if !in_hand.is_empty() {
            tracing::info!(
                in_hand = in_hand.len(),
                ?grace,
                "stopping: finishing the messages in hand"
            );
        }
        if tokio::time::timeout(grace, join_all(&mut in_hand)).await.is_err() {
            tracing::info!(
                in_hand = in_hand.len(),
                "shutdown grace over: releasing the tasks in hand"
            );
            let _ = release_tx.send(true);
            // A release is one store write and one SQS call per task; bound it
            // anyway, so a stuck store cannot hold the process (its leases then
            // simply expire).
            if tokio::time::timeout(RELEASE_WITHIN, join_all(&mut in_hand))
                .await
                .is_err()
            {
                tracing::warn!(left = in_hand.len(), "releases did not finish; abandoning them");
                in_hand.abort_all();
            }
        }
    }

    /// A message whose body is not a task id: a poison message. With a
    /// redrive policy, leaving it would move it to the dead-letter queue after
    /// maxReceiveCount; here we drop it.
    async fn drop_malformed(&self, delivery: Delivery) {
        self.stats.deliveries.fetch_add(1, Ordering::Relaxed);
        let _in_flight = self.stats.track(&delivery.message_id);
        tracing::warn!(body = %delivery.body, "message body is not a task id; deleting it");
        self.stats.malformed.fetch_add(1, Ordering::Relaxed);
        self.act(|q| q.delete(&delivery.receipt), "delete").await;
    }

    /// A batch of deliveries of distinct tasks, start to finish:
    /// [`Worker::handle_batch_each`] claims them in one round trip and runs the
    /// acquired ones side by side, each message kept hidden by its own lease's
    /// hooks. Each message is deleted, hidden or left by its own disposition
    /// *as soon as its task settles*, and its slot (`permit`) is free for the
    /// next receive from then on, while its batch-mates still work. When
    /// `release` turns true while provider calls run, those calls are dropped
    /// and their tasks released.
    async fn handle(
        &self,
        deliveries: Vec<(Delivery, OwnedSemaphorePermit)>,
        release: watch::Receiver<bool>,
    ) {
        let mut batch = Vec::with_capacity(deliveries.len());
        // What each delivery holds until its answer is acted on: its slot and
        // its in-flight mark.
        let mut held = Vec::with_capacity(deliveries.len());
        for (delivery, permit) in deliveries {
            self.stats.deliveries.fetch_add(1, Ordering::Relaxed);
            held.push(Some((self.stats.track(&delivery.message_id), permit)));
            let task_id = delivery.task_id().expect("the caller passes task ids only");
            batch.push((task_id, delivery));
        }
        let task_ids: Vec<TaskId> = batch.iter().map(|(id, _)| *id).collect();
        let hooks = KeepHidden {
            queue: &self.queue,
            receipts: batch.iter().map(|(id, d)| (*id, d.receipt.as_str())).collect(),
            hide_for: self.worker.config().lease + self.settings.visibility_slack,
            stats: &self.stats,
            answered: AtomicBool::new(false),
        };
        // The tasks given back at shutdown, and whether the store took them back.
        let released: Mutex<HashMap<TaskId, Released>> = Mutex::default();
        // Each answer goes into the channel the moment its delivery settles
        // (`on_settled` cannot wait on SQS); `answer` below acts on them in
        // that order while the rest of the batch still works.
        let (settled_tx, mut settled_rx) = mpsc::unbounded_channel();
        let handling = self.worker.handle_batch_each(
            &task_ids,
            &hooks,
            |ctx| {
                let provider = Arc::clone(&self.provider);
                let mut release_asked = release.clone();
                let released = &released;
                async move {
                    let lease = ctx.lease().clone();
                    tokio::select! {
                        biased;
                        result = work(ctx, provider) => result,
                        Ok(()) = async { release_asked.wait_for(|r| *r).await.map(drop) } => {
                            // The grace is over: drop the provider call (between
                            // store writes, never inside a complete or fail) and
                            // give the task back. The runtime's `fail` for this
                            // lease is then refused: the task is pending again.
                            let task_id = lease.task_id();
                            let outcome = self.release(lease).await;
                            released.lock().unwrap().insert(task_id, outcome);
                            Err(Failure::retryable("released at shutdown"))
                        }
                    }
                }
            },
            // Dropped with the handling future, which ends the loop below.
            move |i, answer| {
                let _ = settled_tx.send((i, answer));
            },
        );
        let answer = async {
            // Until the claim answers, the messages are hidden only by the
            // queue's visibility timeout. A claim slower than `CLAIM_GUARD` (a
            // store in trouble, a pool waiting for a connection) gets them
            // hidden for `lease + slack` once, so they do not come back while
            // it is pending. A fast claim costs nothing.
            let guard = tokio::time::sleep(CLAIM_GUARD);
            tokio::pin!(guard);
            let mut guarded = false;
            loop {
                tokio::select! {
                    next = settled_rx.recv() => {
                        let Some((i, answer)) = next else { break };
                        hooks.answered.store(true, Ordering::Relaxed);
                        let (task_id, delivery) = &batch[i];
                        let release = released.lock().unwrap().get(task_id).copied();
                        self.answer(*task_id, delivery, release, answer).await;
                        held[i] = None;
                    }
                    () = &mut guard, if !guarded => {
                        guarded = true;
                        if !hooks.answered.load(Ordering::Relaxed) {
                            let waiting: Vec<&str> = batch
                                .iter()
                                .zip(&held)
                                .filter(|(_, held)| held.is_some())
                                .map(|((_, delivery), _)| delivery.receipt.as_str())
                                .collect();
                            hooks.hide_all(&waiting).await;
                        }
                    }
                }
            }
        };
        let (outcome, ()) = tokio::join!(handling, answer);
        if let Err(error) = outcome {
            // The claim itself failed: no delivery settled. Leave every
            // message; each next delivery re-reads its task.
            tracing::warn!(tasks = task_ids.len(), %error, "store error; leaving the batch's messages");
            self.stats
                .store_errors
                .fetch_add(task_ids.len() as u64, Ordering::Relaxed);
        }
    }

    /// Acts on one delivery's answer: delete, hide or leave its message.
    async fn answer(
        &self,
        task_id: TaskId,
        delivery: &Delivery,
        release: Option<Released>,
        answer: taskfence::Result<Disposition>,
    ) {
        if let Some(release) = release {
            // Released at shutdown: visible at once for another worker.
            if release == Released::Accepted {
                self.act(
                    |q| q.hide_for(&delivery.receipt, Duration::ZERO),
                    "change visibility",
                )
                .await;
            }
            return;
        }
        let disposition = match answer {
            Ok(disposition) => disposition,
            Err(error) => {
                // The store failed for this delivery: leave the message; its
                // next delivery reads the durable task.
                tracing::warn!(%task_id, %error, "store error; leaving the message");
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        tracing::debug!(%task_id, receive_count = delivery.receive_count, ?disposition, "handled");
        match &disposition {
            // The store has durably settled the task (saved or terminal): now,
            // and only now, the message may go.
            Disposition::Ack(_) => self.act(|q| q.delete(&delivery.receipt), "delete").await,
            // Not deleted: hidden until the claim can succeed (backoff over, or
            // the other worker's lease run out).
            Disposition::RetryAfter { delay, .. } => {
                self.act(|q| q.hide_for(&delivery.receipt, *delay), "change visibility")
                    .await;
            }
            // We no longer hold the task; the message's own timer brings it back.
            Disposition::Leave(_) => {}
        }
        self.stats.count(&disposition, task_id);
    }

    /// Gives the task back at shutdown: pending again at once (the attempt
    /// stays counted). The caller makes its message visible for the next worker.
    async fn release(&self, lease: Lease) -> Released {
        let task_id = lease.task_id();
        match self.store.release(lease).await {
            Ok(Fenced::Accepted(())) => {
                tracing::info!(%task_id, "released at shutdown");
                self.stats.count_name("release.released");
                Released::Accepted
            }
            Ok(Fenced::Rejected(rejection)) => {
                // No longer ours (lost to a takeover): its message timer decides.
                tracing::info!(%task_id, %rejection, "release refused; leaving the message");
                self.stats.count_name("release.rejected");
                Released::Refused
            }
            Err(error) => {
                // The lease expires on its own; the message comes back after it.
                tracing::warn!(%task_id, %error, "release failed; leaving the message");
                self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                Released::Failed
            }
        }
    }

    async fn act<'a, F, Fut>(&'a self, call: F, what: &str)
    where
        F: FnOnce(&'a SqsQueue) -> Fut,
        Fut: Future<Output = Result<(), crate::queue::BoxError>>,
    {
        if let Err(error) = call(&self.queue).await {
            // Harmless for correctness: the message is redelivered and the claim
            // answers from the durable task record.
            tracing::warn!(%error, "{what} failed");
        }
    }
}

/// How long a claim may take before the messages waiting for it are hidden
/// for `lease + slack` (once per receive).
const CLAIM_GUARD: Duration = Duration::from_secs(1);

/// How long the releases at the end of a shutdown may take.
const RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// Waits for every handler, logging the ones that panicked.
async fn join_all(set: &mut JoinSet<()>) {
    while let Some(done) = set.join_next().await {
        if let Err(e) = done {
            tracing::error!(error = %e, "message handler panicked");
        }
    }
}

/// What became of a release at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// The task is pending again: make its message visible.
    Accepted,
    /// The lease was no longer ours: leave the message.
    Refused,
    /// The store failed: leave the message; the lease expires on its own.
    Failed,
}

/// Keeps each message of a batch hidden for as long as its task's lease lives.
/// The lease is the right to work on the task (store clock); the visibility
/// timeout only hides the message from other consumers (SQS clock). Neither
/// stops the other. The hooks fire per lease: the task id picks the message.
/// (The messages of tasks not acquired need nothing: their answer is acted on
/// as soon as the claim returns.)
struct KeepHidden<'a> {
    queue: &'a SqsQueue,
    receipts: HashMap<TaskId, &'a str>,
    hide_for: Duration,
    stats: &'a Stats,
    /// Set once the claim has answered (a lease granted or a delivery settled).
    answered: AtomicBool,
}

impl KeepHidden<'_> {
    /// Hides `receipts` for `hide_for`, ten per `ChangeMessageVisibilityBatch`.
    async fn hide_all(&self, receipts: &[&str]) {
        for chunk in receipts.chunks(crate::queue::MAX_BATCH) {
            match self.queue.hide_all_for(chunk, self.hide_for).await {
                Ok(hidden) => {
                    self.stats.extensions.fetch_add(hidden as u64, Ordering::Relaxed);
                    let failed = (chunk.len() - hidden.min(chunk.len())) as u64;
                    self.stats.extension_errors.fetch_add(failed, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::warn!(%error, "visibility extension failed");
                    self.stats
                        .extension_errors
                        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            }
        }
    }

    async fn extend(&self, lease: &Lease) {
        let Some(receipt) = self.receipts.get(&lease.task_id()) else {
            return;
        };
        match self.queue.hide_for(receipt, self.hide_for).await {
            Ok(()) => self.stats.extensions.fetch_add(1, Ordering::Relaxed),
            Err(error) => {
                // Not fatal: at worst the message is delivered again meanwhile and
                // that delivery's claim answers Busy.
                tracing::warn!(%error, "visibility extension failed");
                self.stats.extension_errors.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

#[async_trait]
impl LeaseHooks for KeepHidden<'_> {
    async fn on_claimed(&self, lease: &Lease) {
        self.answered.store(true, Ordering::Relaxed);
        self.extend(lease).await;
    }
    async fn on_renewed(&self, lease: &Lease) {
        self.extend(lease).await;
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
