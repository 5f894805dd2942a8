//! The handoff dispatcher: publishes the transactional outbox that
//! [`submit`](crate::TaskStore::submit) writes with each task. (Tasks that
//! need a worker again are re-published by
//! [`dispatch_due`](crate::dispatch::dispatch_due), on any store.)

use std::future::Future;

use sqlx::Row;
use tracing::Instrument;

use crate::dispatch::Dispatched;
use crate::error::Result;
use crate::limits;

use crate::backend::entry;
use crate::task::TaskId;
use crate::wire::Stamp;

use super::{PgStore, db};

impl PgStore {
    /// Publishes up to `limit` pending handoffs (the transactional outbox):
    /// claims them with `FOR UPDATE SKIP LOCKED` (so several dispatchers share
    /// the work), calls `publish` with each task's [`Stamp`] in order, and
    /// marks the published ones in the same transaction.
    ///
    /// The stamp's version is the task's assignment version read by the same
    /// statement that claims the handoffs: 0 for a task never claimed, higher
    /// for one reopened or taken by `claim_next` meanwhile. The claim the
    /// message leads to gets a higher one.
    ///
    /// A crash between publishing and the commit publishes the same task id
    /// again next round: at least once, and every copy points to the same task.
    /// A failed publish stops the round; that handoff stays pending.
    ///
    /// `publish` must return only once the message is *durably* in the queue
    /// (the broker acknowledged it). A task that was never claimed is not
    /// [`due`](crate::TaskStore::due), so a handoff marked published while its message
    /// only sat in process memory would be lost with the process.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let round = store
    ///     .dispatch(100, |stamp| async move {
    ///         // send `stamp.task_id`, with `stamp.headers()`, to SQS / Kafka here
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// println!("published {}", round.published.len());
    /// # Ok(()) }
    /// ```
    pub async fn dispatch<F, Fut, E>(&self, limit: usize, mut publish: F) -> Result<Dispatched<E>>
    where
        F: FnMut(Stamp) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        self.dispatch_batches(limit, 1, |stamps| publish(stamps[0])).await
    }

    /// [`dispatch`](Self::dispatch) with `publish` called for up to `batch`
    /// stamps at a time (SQS `SendMessageBatch` takes 10, a Kafka producer
    /// any number): fewer requests to the broker for the same round.
    ///
    /// `publish` must return `Ok` only once every message of the batch is
    /// durably in the queue. An `Err` stops the round and leaves the whole
    /// batch pending, also the messages that did get through (a partial
    /// failure): the next round publishes them again, and every copy points to
    /// the same task. [`Dispatched::failed`] names the batch's first task.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
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
        mut publish: F,
    ) -> Result<Dispatched<E>>
    where
        F: FnMut(Vec<Stamp>) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        limits::check_scan_limit(limit)?;
        if batch == 0 || batch > limits::MAX_BATCH {
            return Err(crate::error::InvalidInput::OutOfRange {
                field: "batch",
                value: batch.to_string(),
                min: "1".into(),
                max: limits::MAX_BATCH.to_string(),
            }
            .into());
        }
        let span = entry::span("dispatch", None);
        async move {
            let mut tx = self.pool.begin().await.map_err(db)?;
            self.check_schema(&mut tx).await?;
            let handoffs: Vec<(i64, Stamp)> = self
                .sql
                .claim_handoffs
                .query()
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?
                .iter()
                .map(|row| {
                    let id = TaskId::from_uuid(row.try_get(1)?);
                    // No task (a stray handoff): version 0, and the claim finds nothing.
                    let version = row.try_get::<Option<i64>, _>(2)?.unwrap_or(0);
                    Ok((
                        row.try_get(0)?,
                        Stamp::new(id, u64::try_from(version).unwrap_or(0)),
                    ))
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(db)?;
            let mut marked = Vec::with_capacity(handoffs.len());
            let mut published = Vec::with_capacity(handoffs.len());
            let mut failed = None;
            for chunk in handoffs.chunks(batch) {
                let stamps: Vec<Stamp> = chunk.iter().map(|&(_, stamp)| stamp).collect();
                match publish(stamps).await {
                    Ok(()) => {
                        marked.extend(chunk.iter().map(|&(handoff, _)| handoff));
                        published.extend(chunk.iter().map(|(_, stamp)| stamp.task_id));
                    }
                    Err(err) => {
                        failed = Some((chunk[0].1.task_id, err));
                        break;
                    }
                }
            }
            if !marked.is_empty() {
                self.sql
                    .mark_published
                    .query()
                    .bind(&marked)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            tx.commit().await.map_err(db)?;
            Ok(Dispatched { published, failed })
        }
        .instrument(span)
        .await
    }
}
