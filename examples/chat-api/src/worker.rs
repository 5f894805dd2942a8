//! The in-process reply worker: a [`Consumer`] that takes reply tasks
//! straight from the store ([`StoreQueue`]) and calls the [`ReplyProvider`].
//!
//! Why the store is the queue: the API writes each reply task in the
//! transaction that saves the user's message, so there is nothing to hand
//! off and no second system to lose it in. The API wakes the consumer after
//! its commit, so a reply starts at once; work nobody wakes it for (a Send in
//! another process, a retry past its backoff, a crashed worker's expired
//! lease) is found by polling.
//!
//! Why the graceful stop: on a deploy, replies in flight get
//! [`WorkerSettings::grace`] to finish, and the rest are released, so another
//! process claims them at once rather than after their lease.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use taskfence::runtime::{Consumer, ConsumerConfig, StoreQueue, WorkContext};
use taskfence::{Failure, Response, Result};

use crate::api::OPERATION;
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
/// call still running when another worker takes the task over is dropped, and
/// so is one still running when a stopping service's grace is over.
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

/// The work function the consumer runs for a claimed reply task.
pub(crate) async fn generate(
    provider: Arc<dyn ReplyProvider>,
    ctx: WorkContext,
) -> Result<Response, Failure> {
    let payload: ReplyPayload = serde_json::from_slice(&ctx.task().payload)
        .map_err(|e| Failure::permanent(format!("unreadable reply payload: {e}")))?;
    tokio::select! {
        text = provider.reply(&payload.prompt, ctx.lease().attempt()) => text.map(Response::from),
        // Another worker owns the task now: stop paying for this call.
        () = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
    }
}

/// The reply consumer on `replies` (whose completions save the reply rows),
/// taking only reply tasks.
pub(crate) fn consumer(replies: ReplyStore, settings: &WorkerSettings) -> Result<Consumer<StoreQueue>> {
    let queue = StoreQueue::new(Arc::new(replies)).operation(OPERATION);
    Ok(queue.consumer(consumer_config("chat-worker", settings, settings.concurrency))?)
}

/// A consumer's settings from the worker's flags, `n` tasks at once.
pub(crate) fn consumer_config(name: &str, settings: &WorkerSettings, n: usize) -> ConsumerConfig {
    // A provider call takes seconds: a waiting task stays in the store,
    // where any idle process can take it, not leased to a busy one.
    settings.consumer_config(name).concurrency(n).prefetch(0)
}
