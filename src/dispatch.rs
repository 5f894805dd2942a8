//! The outbox dispatcher: [`Outbox::dispatch`] publishes the handoffs that
//! [`submit`](crate::TaskStore::submit) (and [`reopen`](crate::TaskStore::reopen),
//! and [`Outbox::redispatch`]) write in the task's own transaction, and
//! reports what one round did ([`Published`]).
//!
//! Why an outbox: the task and the record that it must be published (its
//! handoff) are written atomically, so no task is created without a message
//! and no message names a task that does not exist. The dispatcher then
//! publishes each handoff *at least once*: it marks a handoff published only
//! after `publish` returned `Ok`, so a crash in between publishes it again,
//! and every copy points to the same task (a claim decides who works).
//!
//! The round is written once, here, for every store with an outbox (a
//! [`backend::OutboxBackend`](crate::backend::OutboxBackend): `PgStore`,
//! `DynamoStore`): take up to `limit` handoffs oldest first, publish them in
//! batches, mark each accepted batch, stop at the first refusal. Tasks that
//! need a worker again are published by a different loop, on any store:
//! [`republish_due`](crate::republish::republish_due).
//!
//! Three words, three things: **dispatch** publishes the outbox's pending
//! handoffs (this module); **redispatch** writes a fresh handoff for a
//! pending task whose message was lost (a stranded task), for the dispatcher
//! to publish; **republish** publishes again, without the outbox, the tasks
//! that need a worker again ([`republish_due`](crate::republish::republish_due)).
//!
//! Every round hands `publish` [`Stamp`]s: the task id and the task's
//! assignment version as the round read it, for the message's headers
//! ([`Stamp::headers`]).
//!
//! Handoffs are written by default, on both stores: forgetting to ask for
//! an outbox would strand work silently. An application that runs no
//! dispatcher builds its store `without_handoffs()`
//! (`PgStoreBuilder::without_handoffs`, `DynamoStoreBuilder::without_handoffs`)
//! so nothing accumulates unpublished until the purge; one task at a time,
//! [`NewTask::without_handoff`](crate::NewTask::without_handoff) does the same.

use std::future::Future;

use tracing::Instrument;

use crate::backend::{OutboxBackend, entry};
use crate::error::Result;
use crate::store::TaskStore;
use crate::task::TaskId;
use crate::wire::Stamp;

pub use crate::republish::Published;

/// The former name of [`Published`].
#[deprecated(note = "renamed to `Published`: a republish round returns it too")]
pub type Dispatched<E> = Published<E>;

/// The former name of [`republish_due`](crate::republish::republish_due).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// # #[allow(deprecated)]
/// let round = taskfence::dispatch::dispatch_due(&taskfence::MemoryStore::new(), 10, |_| async {
///     Ok::<(), std::io::Error>(())
/// })
/// .await?;
/// assert!(round.published.is_empty());
/// # Ok(()) }
/// ```
#[deprecated(
    note = "renamed to `taskfence::republish::republish_due`: \"dispatch\" now names the outbox dispatcher only"
)]
pub async fn dispatch_due<S, F, Fut, E>(store: &S, limit: usize, publish: F) -> Result<Published<E>>
where
    S: TaskStore + ?Sized,
    F: FnMut(Stamp) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: Send,
{
    crate::republish::republish_due(store, limit, publish).await
}

/// A store with a transactional outbox: publish its handoffs
/// ([`dispatch`](Self::dispatch), [`dispatch_batches`](Self::dispatch_batches))
/// and hand stranded tasks to it again ([`redispatch`](Self::redispatch)).
///
/// Implemented for every [`OutboxBackend`] (`PgStore`, `DynamoStore`), and
/// only there: its methods are written once, here, so the input checks,
/// the `DEBUG` span, the batching and the stop-at-the-first-failure are the
/// same on every backend. How several dispatchers running at once share the
/// outbox is the backend's: on PostgreSQL a round takes its handoffs with `FOR UPDATE SKIP LOCKED` and
/// marks them in the same transaction, so dispatchers never publish the same
/// pending handoff at once; on DynamoDB nothing keeps two rounds apart (run
/// one dispatcher, or accept that two may both publish a handoff: a
/// duplicate like any other), and each batch is marked as soon as it is out.
///
/// ```no_run
/// # async fn f(store: impl taskfence::Outbox) -> taskfence::Result<()> {
/// use taskfence::Outbox;
/// let round = store
///     .dispatch(100, |stamp| async move {
///         // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
///         Ok::<(), std::io::Error>(())
///     })
///     .await?;
/// println!("published {}", round.published.len());
/// # Ok(()) }
/// ```
pub trait Outbox: OutboxBackend {
    /// Publishes up to `limit` pending handoffs (`1..=`[`MAX_SCAN_LIMIT`](crate::limits::MAX_SCAN_LIMIT)),
    /// oldest first: calls `publish` with each task's [`Stamp`] in order,
    /// and marks each one published once its `publish` returned `Ok`.
    ///
    /// The stamp's version is the task's assignment version, read with the
    /// handoffs: 0 for a task never claimed, higher for one reopened or
    /// taken by `claim_next` meanwhile. The claim the message leads to gets
    /// a higher one.
    ///
    /// A crash between publishing and marking publishes the same task id
    /// again next round: at least once, and every copy points to the same
    /// task. A failed publish stops the round; that handoff stays pending.
    ///
    /// `publish` must return only once the message is *durably* in the queue
    /// (the broker acknowledged it). A task that was never claimed is not
    /// [`due`](crate::TaskStore::due), so a handoff marked published while
    /// its message only sat in process memory would be lost with the process.
    ///
    /// ```no_run
    /// # async fn f(outbox: impl taskfence::Outbox) -> taskfence::Result<()> {
    /// use taskfence::Outbox;
    /// let round = outbox
    ///     .dispatch(100, |stamp| async move {
    ///         // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn dispatch<F, Fut, E>(
        &self,
        limit: usize,
        mut publish: F,
    ) -> impl Future<Output = Result<Published<E>>> + Send
    where
        F: FnMut(Stamp) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        round(self, limit, 1, move |stamps: Vec<Stamp>| publish(stamps[0]))
    }

    /// [`dispatch`](Self::dispatch) with `publish` called for up to `batch`
    /// stamps at a time (`1..=`[`MAX_BATCH`](crate::limits::MAX_BATCH); SQS
    /// `SendMessageBatch` takes 10, a Kafka producer any number): fewer
    /// requests to the broker for the same round.
    ///
    /// `publish` must return `Ok` only once every message of the batch is
    /// durably in the queue. An `Err` stops the round and leaves the whole
    /// batch pending, also the messages that did get through (a partial
    /// failure): the next round publishes them again, and every copy points
    /// to the same task. [`Published::failed`] names the batch's first task.
    /// The batches published before it are marked.
    ///
    /// ```no_run
    /// # async fn f(store: impl taskfence::Outbox) -> taskfence::Result<()> {
    /// use taskfence::Outbox;
    /// let round = store
    ///     .dispatch_batches(100, 10, |stamps| async move {
    ///         // one SendMessageBatch with these ids, each with its stamp's attributes
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn dispatch_batches<F, Fut, E>(
        &self,
        limit: usize,
        batch: usize,
        publish: F,
    ) -> impl Future<Output = Result<Published<E>>> + Send
    where
        F: FnMut(Vec<Stamp>) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        round(self, limit, batch, publish)
    }

    /// Writes a fresh, unpublished handoff for each of `ids` that is still
    /// pending (and was not submitted
    /// [`without_handoff`](crate::NewTask::without_handoff)), so the running
    /// dispatcher ([`dispatch`](Self::dispatch)) publishes it again: what an
    /// operator does with the tasks
    /// [`stranded`](crate::inspect::Inspect::stranded) lists, whose queue
    /// message was lost. Returns how many handoffs were written; unknown and
    /// no longer pending tasks are skipped (a task claimed meanwhile needs no
    /// message). A duplicate message is harmless: claims decide who works.
    ///
    /// Ids must be distinct and at most [`MAX_BATCH`](crate::limits::MAX_BATCH);
    /// bad input is a typed error and writes nothing.
    ///
    /// ```no_run
    /// # async fn f(store: impl taskfence::Outbox + taskfence::inspect::Inspect) -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::Outbox;
    /// use taskfence::inspect::Inspect;
    /// let lost: Vec<_> = store.stranded(Duration::from_secs(3600), 100).await?.iter().map(|t| t.id).collect();
    /// let written = store.redispatch(&lost).await?;
    /// # Ok(()) }
    /// ```
    fn redispatch(&self, ids: &[TaskId]) -> impl Future<Output = Result<u64>> + Send {
        async move {
            let span = entry::redispatch(ids)?;
            if ids.is_empty() {
                return Ok(0);
            }
            self.write_handoffs(ids).instrument(span).await
        }
    }
}

/// Every outbox backend is an [`Outbox`], with these very methods.
impl<B: OutboxBackend + ?Sized> Outbox for B {}

/// Writes [`Outbox`]'s methods again as inherent methods of a store with an
/// outbox (`PgStore`, `DynamoStore`), each forwarding to the trait's: so
/// `store.dispatch(…)` needs no import, as it did before the trait, and
/// generic code takes an `S: Outbox`. The methods are written once, here.
#[cfg(any(feature = "postgres", feature = "dynamodb"))]
macro_rules! inherent_outbox_methods {
    ($store:ident) => {
        impl $store {
            /// The dispatcher's round:
            /// [`Outbox::dispatch`](crate::dispatch::Outbox::dispatch), callable
            /// without importing the trait (its documentation says everything).
            ///
            #[doc = concat!("```no_run\n# async fn f(store: taskfence::", stringify!($store), ") -> taskfence::Result<()> {")]
            /// let round = store
            ///     .dispatch(100, |stamp| async move {
            ///         // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
            ///         Ok::<(), std::io::Error>(())
            ///     })
            ///     .await?;
            /// println!("published {}", round.published.len());
            /// # Ok(()) }
            /// ```
            pub async fn dispatch<F, Fut, E>(&self, limit: usize, publish: F) -> $crate::Result<$crate::dispatch::Published<E>>
            where
                F: FnMut($crate::wire::Stamp) -> Fut + Send,
                Fut: std::future::Future<Output = std::result::Result<(), E>> + Send,
                E: Send,
            {
                $crate::dispatch::Outbox::dispatch(self, limit, publish).await
            }

            /// The dispatcher's round in batches:
            /// [`Outbox::dispatch_batches`](crate::dispatch::Outbox::dispatch_batches),
            /// callable without importing the trait.
            ///
            #[doc = concat!("```no_run\n# async fn f(store: taskfence::", stringify!($store), ") -> taskfence::Result<()> {")]
            /// let round = store
            ///     .dispatch_batches(100, 10, |stamps| async move {
            ///         // one SendMessageBatch with these ids, each with its stamp's attributes
            ///         Ok::<(), std::io::Error>(())
            ///     })
            ///     .await?;
            /// # Ok(()) }
            /// ```
            pub async fn dispatch_batches<F, Fut, E>(
                &self,
                limit: usize,
                batch: usize,
                publish: F,
            ) -> $crate::Result<$crate::dispatch::Published<E>>
            where
                F: FnMut(Vec<$crate::wire::Stamp>) -> Fut + Send,
                Fut: std::future::Future<Output = std::result::Result<(), E>> + Send,
                E: Send,
            {
                $crate::dispatch::Outbox::dispatch_batches(self, limit, batch, publish).await
            }

            /// Hands pending tasks to the dispatcher again:
            /// [`Outbox::redispatch`](crate::dispatch::Outbox::redispatch),
            /// callable without importing the trait.
            ///
            #[doc = concat!("```no_run\n# async fn f(store: taskfence::", stringify!($store), ", lost: Vec<taskfence::TaskId>) -> taskfence::Result<()> {")]
            /// let written = store.redispatch(&lost).await?;
            /// # Ok(()) }
            /// ```
            pub async fn redispatch(&self, ids: &[$crate::TaskId]) -> $crate::Result<u64> {
                $crate::dispatch::Outbox::redispatch(self, ids).await
            }
        }
    };
}
#[cfg(any(feature = "postgres", feature = "dynamodb"))]
pub(crate) use inherent_outbox_methods;

/// The dispatcher loop, the one round every outbox runs: take, publish in
/// batches, mark each accepted batch, stop at the first refusal, end.
async fn round<B, F, Fut, E>(store: &B, limit: usize, batch: usize, mut publish: F) -> Result<Published<E>>
where
    B: OutboxBackend + ?Sized,
    F: FnMut(Vec<Stamp>) -> Fut + Send,
    Fut: Future<Output = std::result::Result<(), E>> + Send,
    E: Send,
{
    let span = entry::dispatch(limit, batch)?;
    async move {
        let (mut taken, handoffs) = store.take_handoffs(limit).await?;
        let mut published = Vec::with_capacity(handoffs.len());
        let mut failed = None;
        for chunk in handoffs.chunks(batch) {
            let stamps: Vec<Stamp> = chunk.iter().map(|&(stamp, _)| stamp).collect();
            match publish(stamps).await {
                Ok(()) => {
                    store.mark_published(&mut taken, chunk).await?;
                    published.extend(chunk.iter().map(|(stamp, _)| stamp.task_id));
                }
                Err(err) => {
                    failed = Some((chunk[0].0.task_id, err));
                    break;
                }
            }
        }
        store.end_round(taken).await?;
        Ok(Published { published, failed })
    }
    .instrument(span)
    .await
}
