//! The in-process reply worker: the outbox dispatcher feeds task ids straight
//! into [`taskfence::runtime::Worker::handle`], which calls the [`ReplyProvider`].
//!
//! There is no external queue here, so the one thing a queue would add — the
//! message survives a crash — comes from the outbox itself: a handoff is
//! marked published only once a worker has **durably claimed** its task
//! ([`LeaseHooks::on_claimed`]), or found it needs no work. A crash before that
//! leaves the handoff pending and the next round publishes it again; a crash
//! after it leaves a lease that expires, and [`dispatch_due`](taskfence::dispatch::dispatch_due) brings
//! the task back (as it does for tasks waiting out a retry backoff). The
//! dispatcher's transaction spans only those claims, never a provider call.

use std::sync::{Arc, Mutex};

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

/// The model provider: the one thing to replace when copying this template
/// (`sim::SimulatedLlm` stands in for it in the binary and the tests).
///
/// Called once per claimed attempt, raced against the loss of the lease: a
/// call still running when another worker takes the task over is dropped.
///
/// ```
/// use chat_api::ReplyProvider;
/// use taskfence::Failure;
///
/// struct Echo;
///
/// #[async_trait::async_trait]
/// impl ReplyProvider for Echo {
///     async fn reply(&self, prompt: &str, _attempt: u32) -> Result<String, Failure> {
///         Ok(prompt.to_owned())
///     }
/// }
/// ```
#[async_trait]
pub trait ReplyProvider: Send + Sync + 'static {
    /// The reply to `prompt`, on this task's `attempt` (1-based; pass it on as
    /// the provider's idempotency key suffix if it has one). A
    /// [`Failure::retryable`] is retried within the task's budget, a
    /// [`Failure::permanent`] fails the task.
    async fn reply(&self, prompt: &str, attempt: u32) -> Result<String, Failure>;
}

/// The work function [`Worker::handle`] runs for a claimed reply task.
async fn generate(provider: Arc<dyn ReplyProvider>, ctx: WorkContext) -> Result<Response, Failure> {
    let payload: ReplyPayload = serde_json::from_slice(&ctx.task().payload)
        .map_err(|e| Failure::permanent(format!("unreadable reply payload: {e}")))?;
    tokio::select! {
        text = provider.reply(&payload.prompt, ctx.lease().attempt()) => text.map(Response::from),
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
    provider: Arc<dyn ReplyProvider>,
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
        let (worker, provider) = (self.worker.clone(), Arc::clone(&self.provider));
        self.running.spawn(async move {
            let signal = ClaimedSignal(Mutex::new(Some(tx)));
            let outcome = worker
                .handle(task_id, &signal, |ctx| generate(provider, ctx))
                .await;
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
    provider: Arc<dyn ReplyProvider>,
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
        provider,
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
            match taskfence::dispatch::dispatch_due(&store, free, runner.publisher()).await {
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
