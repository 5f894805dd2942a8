//! The handoff dispatcher on DynamoDB: publishes the outbox that
//! [`submit`](crate::TaskStore::submit) (and [`reopen`](crate::TaskStore::reopen),
//! and [`DynamoStore::redispatch`]) writes in the task's own transaction.
//! The same API and guarantees as `PgStore::dispatch`: at least once,
//! marked published only after `publish` succeeded. (Tasks that need a
//! worker again are re-published by [`dispatch_due`](crate::dispatch::dispatch_due),
//! on any store.)
//!
//! A handoff is an item in its task's partition (`sk = H#<instant>#<uuid>`)
//! that carries the `due` index's keys under the partition-key value
//! `handoff` while it is unpublished: a round queries that index partition,
//! oldest first, reads the handoffs again consistently (the index lags the
//! table a moment: a handoff marked by the previous round is not published
//! twice for that), publishes, and marks each published handoff with one
//! `UpdateItem` that sets `published_at` and takes it out of the index.

use std::collections::HashMap;
use std::future::Future;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::backend::entry;
use crate::dispatch::Dispatched;
use crate::error::{InvalidInput, Result};
use crate::limits;
use crate::task::{Status, TaskId};
use crate::wire::Stamp;

use super::expr::Expr;
use super::item::{self, Item, at, s};
use super::read::{BATCH_GET, sort_key, task_id_of};
use super::store::DynamoStore;
use super::table::{DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY};
use super::tx::{CONFLICT_RETRIES, Layout, Tx, pause, sdk};

impl DynamoStore {
    /// Publishes up to `limit` pending handoffs (the transactional outbox),
    /// oldest first: calls `publish` with each task's [`Stamp`] in order,
    /// and marks each one published once its `publish` returned `Ok`.
    ///
    /// The stamp's version is the task's assignment version, read
    /// consistently with the handoffs (the same `BatchGetItem`): 0 for a
    /// task never claimed, higher for one reopened or taken by `claim_next`
    /// meanwhile. The claim the message leads to gets a higher one.
    ///
    /// A crash between publishing and marking publishes the same task id
    /// again next round: at least once, and every copy points to the same
    /// task. A failed publish stops the round; that handoff stays pending.
    /// Unlike PostgreSQL's `FOR UPDATE SKIP LOCKED`, nothing keeps two
    /// dispatchers apart here: run one, or accept that two running at once
    /// may both publish a handoff (a duplicate like any other).
    ///
    /// `publish` must return only once the message is *durably* in the queue
    /// (the broker acknowledged it). A task that was never claimed is not
    /// [`due`](crate::TaskStore::due), so a handoff marked published while its
    /// message only sat in process memory would be lost with the process.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore) -> taskfence::Result<()> {
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
    /// The batches published before it stay marked.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore) -> taskfence::Result<()> {
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
            return Err(InvalidInput::OutOfRange {
                field: "batch",
                value: batch.to_string(),
                min: "1".into(),
                max: limits::MAX_BATCH.to_string(),
            }
            .into());
        }
        let span = entry::span("dispatch", None);
        async move {
            let handoffs = self.pending_handoffs(limit).await?;
            let mut published = Vec::with_capacity(handoffs.len());
            let mut failed = None;
            for chunk in handoffs.chunks(batch) {
                let stamps: Vec<Stamp> = chunk.iter().map(|(stamp, _)| *stamp).collect();
                match publish(stamps).await {
                    Ok(()) => {
                        // Marked as soon as they are out: a later failure
                        // in this round publishes none of them again.
                        self.mark_published(chunk).await?;
                        published.extend(chunk.iter().map(|(stamp, _)| stamp.task_id));
                    }
                    Err(err) => {
                        failed = Some((chunk[0].0.task_id, err));
                        break;
                    }
                }
            }
            Ok(Dispatched { published, failed })
        }
        .instrument(span)
        .await
    }

    /// Writes a fresh, unpublished handoff for each of `ids` that is still
    /// pending (and was not submitted
    /// [`without_handoff`](crate::NewTask::without_handoff)), so the running
    /// dispatcher ([`dispatch`](Self::dispatch)) publishes it again: what an
    /// operator does with the tasks
    /// [`stranded`](crate::inspect::Inspect::stranded) lists, whose queue
    /// message was lost. Returns how many handoffs were written; unknown and
    /// no longer pending tasks are skipped. One `TransactWriteItems` per id
    /// (a condition check on the task, the new handoff), concurrent. A
    /// duplicate message is harmless: claims decide who works.
    ///
    /// Ids must be distinct and at most [`limits::MAX_BATCH`]; bad input is a
    /// typed error and writes nothing.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore) -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::inspect::Inspect;
    /// let lost: Vec<_> = store.stranded(Duration::from_secs(3600), 100).await?.iter().map(|t| t.id).collect();
    /// let written = store.redispatch(&lost).await?;
    /// # Ok(()) }
    /// ```
    pub async fn redispatch(&self, ids: &[TaskId]) -> Result<u64> {
        limits::check_batch(ids.iter().copied())?;
        if ids.is_empty() {
            return Ok(0);
        }
        let span = entry::span("redispatch", None);
        async move {
            let ids = ids.to_vec();
            let written = Self::concurrently(ids.len(), |i| {
                let (store, id) = (self.clone(), ids[i]);
                async move {
                    let check = Expr::default()
                        .cond(
                            "#status = :c_pending AND attribute_not_exists(#purging) \
                             AND (attribute_not_exists(#handoff) OR #handoff = :c_yes)",
                            &[item::STATUS, item::PURGING, item::HANDOFF],
                            vec![
                                (":c_pending", s(Status::Pending.as_str())),
                                (":c_yes", aws_sdk_dynamodb::types::AttributeValue::Bool(true)),
                            ],
                        )
                        .check(&store.table, item::key_of(item::task_pk(id), item::TASK_SK));
                    let items = vec![check, store.handoff_put(id, store.now())];
                    match store.transact("redispatch", items, Layout::OWN).await? {
                        Tx::Written => Ok(1u64),
                        Tx::Refused(_) | Tx::KeyTaken(_) | Tx::RecordChanged => Ok(0),
                    }
                }
            })
            .await?;
            written.into_iter().sum::<Result<u64>>()
        }
        .instrument(span)
        .await
    }

    /// The put of a new, unpublished handoff of task `id`, for the task's
    /// own transaction (submit, reopen, redispatch). Its key is fresh: no
    /// condition.
    pub(super) fn handoff_put(&self, id: TaskId, now: OffsetDateTime) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item::handoff_item(id, now)))
            .build()
            .expect("table and item are set");
        TransactWriteItem::builder().put(put).build()
    }

    /// Up to `limit` unpublished handoffs, oldest first, as (stamp, key):
    /// from the `handoff` partition of the `due` index (eventually
    /// consistent), then read again consistently with their tasks (for the
    /// stamps' versions), so a handoff already published (or purged with its
    /// task) is left out.
    async fn pending_handoffs(&self, limit: usize) -> Result<Vec<(Stamp, Item)>> {
        let entries = self
            .query_all(
                Some(DUE_INDEX),
                "#shard = :shard",
                HashMap::from([("#shard".to_owned(), DUE_SHARD.to_owned())]),
                HashMap::from([(":shard".to_owned(), s(item::HANDOFF_SHARD))]),
                Some(limit),
            )
            .await?;
        let keys: Vec<Item> = entries
            .iter()
            .map(|e| Ok(item::key_of(item::task_pk(task_id_of(e)?), sort_key(e))))
            .collect::<Result<_>>()?;
        let mut tasks: Vec<TaskId> = keys.iter().map(task_id_of).collect::<Result<_>>()?;
        tasks.sort_unstable();
        tasks.dedup();
        let task_keys = tasks
            .iter()
            .map(|&id| item::key_of(item::task_pk(id), item::TASK_SK));
        let wanted: Vec<Item> = keys.iter().cloned().chain(task_keys).collect();
        let mut current: HashMap<(TaskId, String), Item> = HashMap::with_capacity(wanted.len());
        for chunk in wanted.chunks(BATCH_GET) {
            for found in self.batch_get_keys(chunk.to_vec()).await? {
                current.insert((task_id_of(&found)?, sort_key(&found).to_owned()), found);
            }
        }
        let mut pending = Vec::with_capacity(entries.len());
        for key in keys {
            let id = task_id_of(&key)?;
            let Some(found) = current.remove(&(id, sort_key(&key).to_owned())) else {
                continue; // purged with its task
            };
            if found.contains_key(item::PUBLISHED_AT) {
                continue;
            }
            let Some(task) = current.get(&(id, item::TASK_SK.to_owned())) else {
                continue; // its task is being purged: the handoff goes with it
            };
            let version = item::task(task).map_err(crate::error::Error::storage)?.version;
            pending.push((Stamp::new(id, version), key));
        }
        Ok(pending)
    }

    /// Marks published handoffs: one `UpdateItem` each (concurrent) that
    /// sets `published_at` and takes the handoff out of the index, on the
    /// condition that the item still exists (a handoff purged with its task
    /// meanwhile is not written back as a stray item).
    async fn mark_published(&self, handoffs: &[(Stamp, Item)]) -> Result<()> {
        let now = self.now();
        let marked = Self::concurrently(handoffs.len(), |i| {
            let (store, key) = (self.clone(), handoffs[i].1.clone());
            async move { store.mark_one(key, now).await }
        })
        .await?;
        marked.into_iter().collect()
    }

    async fn mark_one(&self, key: Item, now: OffsetDateTime) -> Result<()> {
        let mut conflicts = 0;
        loop {
            let sent = self
                .client
                .update_item()
                .table_name(&*self.table)
                .set_key(Some(key.clone()))
                .update_expression("SET #published_at = :now REMOVE #due_shard, #due_at")
                .condition_expression("attribute_exists(#pk)")
                .expression_attribute_names("#published_at", item::PUBLISHED_AT)
                .expression_attribute_names("#due_shard", DUE_SHARD)
                .expression_attribute_names("#due_at", DUE_AT)
                .expression_attribute_names("#pk", PARTITION_KEY)
                .expression_attribute_values(":now", at(now))
                .send()
                .await;
            match sent {
                Ok(_) => return Ok(()),
                Err(SdkError::ServiceError(service))
                    if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
                {
                    return Ok(()); // purged with its task: nothing to mark
                }
                // A purge's or a redispatch's transaction holds the item a moment.
                Err(SdkError::ServiceError(service))
                    if matches!(service.err(), UpdateItemError::TransactionConflictException(_))
                        && conflicts < CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                    tokio::time::sleep(pause(conflicts)).await;
                }
                Err(err) => return Err(sdk(err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamodb::SORT_KEY;

    #[test]
    fn a_handoff_key_names_its_task() {
        let id = TaskId::new();
        let key = item::key_of(item::task_pk(id), &item::handoff_sk(OffsetDateTime::UNIX_EPOCH));
        assert_eq!(task_id_of(&key).unwrap(), id);
        assert!(sort_key(&key).starts_with(item::HANDOFF_PREFIX));
        assert!(key.contains_key(SORT_KEY));
    }
}
