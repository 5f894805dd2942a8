//! The outbox on DynamoDB: handoff items under the one dispatcher loop
//! ([`Outbox`](crate::dispatch::Outbox)), written by
//! [`submit`](crate::TaskStore::submit), [`reopen`](crate::TaskStore::reopen)
//! and [`redispatch`](crate::dispatch::Outbox::redispatch) in the task's own
//! transaction.
//!
//! A handoff is an item in its task's partition (`sk = H#<instant>#<uuid>`)
//! that carries the `due` index's keys under the partition-key value
//! `handoff` while it is unpublished: a round queries that index partition,
//! oldest first, reads the handoffs again consistently with their tasks (the
//! index lags the table a moment: a handoff marked by the previous round is
//! not published twice for that; the task's version is the stamp's), and
//! marks each published handoff as soon as its batch is out, with one
//! `UpdateItem` that sets `published_at` and takes it out of the index. A
//! round holds nothing between its steps: unlike PostgreSQL's
//! `FOR UPDATE SKIP LOCKED`, nothing keeps two dispatchers apart here (run
//! one, or accept that two running at once may both publish a handoff, a
//! duplicate like any other).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use time::OffsetDateTime;

use crate::backend::OutboxBackend;
use crate::error::Result;
use crate::task::{Status, TaskId};
use crate::wire::Stamp;

use super::expr::Expr;
use super::item::{self, Item, at, s};
use super::read::{BATCH_GET, sort_key, task_id_of};
use super::store::DynamoStore;
use super::table::{DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY};
use super::tx::{CONFLICT_RETRIES, Layout, Tx, pause, sdk};

crate::dispatch::inherent_outbox_methods!(DynamoStore);

/// The handoffs are items, keyed by their full key; a round holds nothing
/// (each batch is marked as soon as it is out).
#[async_trait]
impl OutboxBackend for DynamoStore {
    type Round = ();
    type Handoff = Item;

    async fn take_handoffs(&self, limit: usize) -> Result<((), Vec<(Stamp, Item)>)> {
        Ok(((), self.pending_handoffs(limit).await?))
    }

    /// One `UpdateItem` per handoff (concurrent) that sets `published_at`
    /// and takes the handoff out of the index, on the condition that the
    /// item still exists (a handoff purged with its task meanwhile is not
    /// written back as a stray item).
    async fn mark_published(&self, _round: &mut (), handoffs: &[(Stamp, Item)]) -> Result<()> {
        let now = self.now();
        let marked = Self::concurrently(handoffs.len(), |i| {
            let (store, key) = (self.clone(), handoffs[i].1.clone());
            async move { store.mark_one(key, now).await }
        })
        .await?;
        marked.into_iter().collect()
    }

    async fn end_round(&self, _round: ()) -> Result<()> {
        Ok(())
    }

    /// One `TransactWriteItems` per id (a condition check on the task, the
    /// new handoff), concurrent.
    async fn write_handoffs(&self, ids: &[TaskId]) -> Result<u64> {
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
}

impl DynamoStore {
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
