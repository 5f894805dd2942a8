//! Publishing tasks to a queue: what a round did ([`Dispatched`]), and
//! [`dispatch_due`], which re-publishes the tasks that need a worker again on
//! any store. (The transactional outbox, the first publication of each
//! task, is `PgStore::dispatch` and `DynamoStore::dispatch`.)
//!
//! Every dispatcher hands `publish` a [`Stamp`]: the task id and the task's
//! assignment version as the dispatcher read it, for the message's headers
//! ([`Stamp::headers`]).

use std::future::Future;

use crate::error::Result;
use crate::store::TaskStore;
use crate::task::TaskId;
use crate::wire::Stamp;

/// What one dispatch round did: [`dispatch_due`], or `PgStore::dispatch` /
/// `DynamoStore::dispatch` (the outbox).
///
/// ```
/// # fn f(d: taskfence::dispatch::Dispatched<std::io::Error>) {
/// println!("published {} tasks", d.published.len());
/// if let Some((task, err)) = d.failed {
///     eprintln!("publishing {task} failed, will retry next round: {err}");
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Dispatched<E> {
    /// The tasks published (and, for handoffs, marked published), in order.
    pub published: Vec<TaskId>,
    /// The first task whose publication failed (with `dispatch_batches`, the
    /// first task of the batch that failed), with the error; the round stopped
    /// there and those handoffs stay pending for the next round.
    pub failed: Option<(TaskId, E)>,
}

/// Re-publishes up to `limit` tasks that need a worker again: leases that
/// expired (a worker crashed) and backoffs that passed (see
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
/// let round = taskfence::dispatch::dispatch_due(&store, 100, |stamp| async move {
///     // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
///     Ok::<(), std::io::Error>(())
/// })
/// .await?;
/// assert!(round.published.is_empty() && round.failed.is_none());
/// # Ok(()) }
/// ```
pub async fn dispatch_due<S, F, Fut, E>(store: &S, limit: usize, mut publish: F) -> Result<Dispatched<E>>
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
            return Ok(Dispatched {
                published,
                failed: Some((task_id, err)),
            });
        }
        published.push(task_id);
    }
    Ok(Dispatched {
        published,
        failed: None,
    })
}
