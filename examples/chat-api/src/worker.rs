//! The in-process reply worker: the outbox dispatcher feeds task ids straight
//! into [`taskfence::Worker::handle`], with a simulated LLM as the provider.
//!
//! There is no external queue here, so the one thing a queue would add — the
//! message survives a crash — comes from the outbox itself: a handoff is
//! marked published only once a worker has **durably claimed** its task
//! ([`LeaseHooks::on_claimed`]), or found it needs no work. A crash before that
//! leaves the handoff pending and the next round publishes it again; a crash
//! after it leaves a lease that expires, and [`PgStore::dispatch_due`] brings
//! the task back (as it does for tasks waiting out a retry backoff). The
//! dispatcher's transaction spans only those claims, never a provider call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use taskfence::runtime::{LeaseHooks, WorkContext, Worker, WorkerConfig};
use taskfence::{Failure, Lease, PgStore, Response, TaskId};
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use tokio::task::JoinSet;

use crate::config::WorkerSettings;
use crate::replies::ReplyStore;

/// What a reply task carries: everything the worker needs, nothing it must look up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplyPayload {
    /// The user's message this task answers.
    pub message_id: uuid::Uuid,
    /// Its content: the prompt.
    pub prompt: String,
}

/// A stand-in for the LLM provider: answers after a fixed latency with
/// deterministic text, so tests can say which attempt produced a reply.
#[derive(Debug, Clone)]
pub struct SimulatedLlm {
    latency: Duration,
}

impl SimulatedLlm {
    /// A provider that takes `latency` per call.
    pub fn new(latency: Duration) -> Self {
        Self { latency }
    }

    /// One provider call: `"Reply to: {prompt} (attempt {n})"`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let llm = chat_api::SimulatedLlm::new(std::time::Duration::ZERO);
    /// assert_eq!(llm.complete("hi", 2).await, "Reply to: hi (attempt 2)");
    /// # }
    /// ```
    pub async fn complete(&self, prompt: &str, attempt: u32) -> String {
        tokio::time::sleep(self.latency).await;
        format!("Reply to: {prompt} (attempt {attempt})")
    }
}

/// The work function [`Worker::handle`] runs for a claimed reply task.
async fn generate(llm: SimulatedLlm, ctx: WorkContext) -> Result<Response, Failure> {
    let payload: ReplyPayload = serde_json::from_slice(&ctx.task().payload)
        .map_err(|e| Failure::permanent(format!("unreadable reply payload: {e}")))?;
    tokio::select! {
        text = llm.complete(&payload.prompt, ctx.lease().attempt()) => Ok(Response::from(text)),
        // Another worker owns the task now: stop paying for this call.
        () = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
    }
}

/// Tells the dispatcher once the task is durably claimed.
struct ClaimedSignal(Mutex<Option<oneshot::Sender<Result<(), NotStarted>>>>);

impl ClaimedSignal {
    fn fire(&self, outcome: Result<(), NotStarted>) {
        if let Some(tx) = self.0.lock().expect("not poisoned").take() {
            let _ = tx.send(outcome);
        }
    }
}

#[async_trait]
impl LeaseHooks for ClaimedSignal {
    async fn on_claimed(&self, _lease: &Lease) {
        self.fire(Ok(()));
    }
}

/// Why a task id could not be handed to a worker this round (the handoff stays pending).
#[derive(Debug, thiserror::Error)]
enum NotStarted {
    #[error("no free worker slot")]
    Full,
    #[error("the store failed before the task was claimed")]
    Store,
}

struct Runner {
    worker: Worker,
    llm: SimulatedLlm,
    slots: Arc<Semaphore>,
    running: JoinSet<()>,
}

impl Runner {
    /// Starts handling `task_id`; the receiver says whether the handoff is
    /// done with (claimed, or no work needed) or must stay pending.
    fn start(&mut self, task_id: TaskId) -> oneshot::Receiver<Result<(), NotStarted>> {
        let (tx, rx) = oneshot::channel();
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            let _ = tx.send(Err(NotStarted::Full));
            return rx;
        };
        let (worker, llm) = (self.worker.clone(), self.llm.clone());
        self.running.spawn(async move {
            let signal = ClaimedSignal(Mutex::new(Some(tx)));
            let outcome = worker.handle(task_id, &signal, |ctx| generate(llm, ctx)).await;
            match &outcome {
                Ok(disposition) => tracing::debug!(%task_id, ?disposition, "handled"),
                Err(error) => tracing::warn!(%task_id, %error, "handling failed; the task will be due again"),
            }
            // Not claimed: Ok means the store settled it (done, busy elsewhere…).
            signal.fire(outcome.map(drop).map_err(|_| NotStarted::Store));
            drop(slot);
        });
        rx
    }

    fn publisher(&mut self) -> impl FnMut(TaskId) -> PublishFuture + Send + '_ {
        |task_id| {
            let rx = self.start(task_id);
            Box::pin(async move { rx.await.unwrap_or(Err(NotStarted::Store)) })
        }
    }
}

type PublishFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), NotStarted>> + Send>>;

/// Runs the worker until `stop` turns true: publish pending handoffs and due
/// tasks into [`Worker::handle`], then sleep until `wake` (a Send in this
/// process) or the poll interval.
pub(crate) async fn run(
    store: PgStore,
    replies: ReplyStore,
    settings: WorkerSettings,
    wake: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let worker_id = format!(
        "chat-worker-{}-{}",
        std::process::id(),
        &uuid::Uuid::now_v7().simple().to_string()[20..]
    );
    let config = WorkerConfig::new(worker_id, settings.lease);
    let worker = match Worker::new(Arc::new(replies), config) {
        Ok(worker) => worker,
        Err(error) => {
            tracing::error!(%error, "invalid worker settings; the worker is not running");
            return;
        }
    };
    let mut runner = Runner {
        worker,
        llm: SimulatedLlm::new(settings.provider_latency),
        slots: Arc::new(Semaphore::new(settings.concurrency.max(1))),
        running: JoinSet::new(),
    };
    while !*stop.borrow() {
        while runner.running.try_join_next().is_some() {}
        let free = runner.slots.available_permits();
        if free > 0 {
            match store.dispatch(free, runner.publisher()).await {
                Ok(round) => log_round("handoff", round.published.len(), round.failed),
                Err(error) => tracing::warn!(%error, "dispatch failed"),
            }
        }
        let free = runner.slots.available_permits();
        if free > 0 {
            match store.dispatch_due(free, runner.publisher()).await {
                Ok(round) => log_round("due", round.published.len(), round.failed),
                Err(error) => tracing::warn!(%error, "dispatch_due failed"),
            }
        }
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(settings.poll_every) => {}
            () = crate::service::stopped(&mut stop) => {}
        }
    }
    // In-flight replies are abandoned: their leases expire and another worker
    // takes them over (counting an attempt). Nothing half-written remains.
    runner.running.shutdown().await;
}

fn log_round(kind: &str, published: usize, failed: Option<(TaskId, NotStarted)>) {
    if published > 0 {
        tracing::debug!(kind, published, "started reply tasks");
    }
    if let Some((task_id, reason)) = failed {
        tracing::debug!(kind, %task_id, %reason, "left for the next round");
    }
}
