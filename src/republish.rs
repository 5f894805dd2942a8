//! Republishing: [`republish_due`] publishes again, on any store, the tasks
//! that need a worker again — a lease that expired (its worker crashed) or a
//! backoff that passed — because the message that led to their last claim is
//! gone from the queue.
//!
//! Why a loop apart from the outbox's: a task's first message comes from its
//! handoff, written with it and published by the dispatcher
//! ([`Outbox::dispatch`](crate::dispatch::Outbox::dispatch)); a task that
//! was claimed and then needs a worker again has no new handoff, and reading
//! [`due`](TaskStore::due) finds it on every store, an outbox or not. A
//! task whose *first* message was lost is stranded, not due: an operator
//! hands it to the outbox again with
//! [`Outbox::redispatch`](crate::dispatch::Outbox::redispatch).

use std::future::Future;

use crate::error::Result;
use crate::store::TaskStore;
use crate::task::TaskId;
use crate::wire::Stamp;

/// What one publishing round did: a dispatch of the outbox
/// ([`Outbox::dispatch`](crate::dispatch::Outbox::dispatch),
/// [`Outbox::dispatch_batches`](crate::dispatch::Outbox::dispatch_batches)) or a
/// [`republish_due`] round.
///
/// ```
/// # fn f(round: taskfence::dispatch::Published<std::io::Error>) {
/// println!("published {} tasks", round.published.len());
/// if let Some((task, err)) = round.failed {
///     eprintln!("publishing {task} failed, will retry next round: {err}");
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Published<E> {
    /// The tasks published (and, for handoffs, marked published), in order.
    pub published: Vec<TaskId>,
    /// The first task whose publication failed (with `dispatch_batches`, the
    /// first task of the batch that failed), with the error; the round
    /// stopped there, and those tasks stay pending (their handoffs
    /// unpublished, or still due) for the next round.
    pub failed: Option<(TaskId, E)>,
}

/// Publishes again up to `limit` tasks that need a worker again: leases
/// that expired (a worker crashed) and backoffs that passed (see
/// [`TaskStore::due`], index-driven). A task stays due until a worker claims
/// it, so a later round may publish it again: claims make that harmless. A
/// failed publish stops the round; the task stays due for the next one.
///
/// `publish` gets each task's [`Stamp`]: its id and its assignment version
/// as read just before publishing (one [`get`](TaskStore::get) per task; a
/// task purged meanwhile is skipped). The claim the message leads to gets a
/// higher version.
///
/// Works on any store, wrapped ones included: through
/// `taskfence::metrics::observe`, the `due` read is counted like any other.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// let store = taskfence::MemoryStore::new();
/// let round = taskfence::republish::republish_due(&store, 100, |stamp| async move {
///     // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
///     Ok::<(), std::io::Error>(())
/// })
/// .await?;
/// assert!(round.published.is_empty() && round.failed.is_none());
/// # Ok(()) }
/// ```
pub async fn republish_due<S, F, Fut, E>(store: &S, limit: usize, mut publish: F) -> Result<Published<E>>
where
    S: TaskStore + ?Sized,
    F: FnMut(Stamp) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: Send,
{
    let due = store.due(limit).await?;
    let mut published = Vec::with_capacity(due.len());
    for task_id in due {
        let Some(task) = store.get(task_id).await? else {
            continue; // purged since `due` listed it: nothing to work on
        };
        if let Err(err) = publish(Stamp::from(&task)).await {
            return Ok(Published {
                published,
                failed: Some((task_id, err)),
            });
        }
        published.push(task_id);
    }
    Ok(Published {
        published,
        failed: None,
    })
}
