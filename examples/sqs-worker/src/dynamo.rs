//! The all-AWS store: taskfence's [`DynamoStore`] on one DynamoDB table, and
//! the template's transactional outbox on DynamoDB ([`DynamoOutbox`]), which
//! the library does not provide for this backend.
//!
//! **The outbox lives in the task table, under its own partition.** A
//! handoff is one item, `pk = "O#handoff"` ([`OUTBOX_PARTITION`]), `sk` = a
//! UUIDv7 (so a `Query` returns the oldest first), with the task's request key
//! (`scope`, `operation`, `rkey`) and `created_at`. It is written by
//! [`DynamoStore::with`] in the task's own `TransactWriteItems`: the
//! task, its dedup record and its handoff commit together or not at all, and a
//! repeated submission writes none of them. The library's items use `T#…` and
//! `K#…` partitions, and a handoff carries none of the attributes of the
//! library's sparse indexes, so neither the store nor its indexes ever see it.
//!
//! **The handoff names the request key, not the task id:** the submission
//! chooses the task id inside the call, after the extra items are built. The
//! dispatcher turns the key into the task id with [`TaskStore::find`] (two
//! consistent reads) before it publishes.

use std::collections::HashMap;
use std::time::SystemTime;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, Put, TransactWriteItem, WriteRequest};
use taskfence::dynamodb::{PARTITION_KEY, SORT_KEY};
use taskfence::{DynamoStore, NewTask, RequestKey, Submitted, TaskId, TaskStore};

use crate::queue::BoxError;

/// The partition key of every handoff item.
pub const OUTBOX_PARTITION: &str = "O#handoff";

/// The most deletes one `BatchWriteItem` takes.
const MAX_DELETES: usize = 25;

/// Fails unless `table` exists and the credentials may describe it: at
/// start-up, so a wrong name, region or role stops the service at once.
pub async fn check_table(client: &Client, table: &str) -> Result<(), BoxError> {
    client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| format!("DynamoDB table {table}: {}", DisplayErrorContext(e)))?;
    Ok(())
}

fn sdk<E: std::error::Error + Send + Sync + 'static>(e: E) -> BoxError {
    DisplayErrorContext(e).to_string().into()
}

/// One pending handoff: "publish the task of this request key".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// The item's sort key (a UUIDv7: creation order).
    pub id: String,
    /// The request key the task was submitted under.
    pub key: RequestKey,
}

/// The transactional outbox of the DynamoDB store, in the store's own table.
#[derive(Debug, Clone)]
pub struct DynamoOutbox {
    store: DynamoStore,
}

impl DynamoOutbox {
    /// The outbox in `store`'s table (through `store`'s client).
    pub fn new(store: DynamoStore) -> Self {
        Self { store }
    }

    /// The task store.
    pub fn store(&self) -> &DynamoStore {
        &self.store
    }

    fn client(&self) -> &Client {
        self.store.client()
    }

    fn table(&self) -> &str {
        self.store.table()
    }

    /// The handoff item for the task submitted under `key`, to put in the
    /// task's transaction.
    pub fn handoff(&self, key: &RequestKey) -> TransactWriteItem {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let put = Put::builder()
            .table_name(self.table())
            .item(PARTITION_KEY, s(OUTBOX_PARTITION))
            .item(SORT_KEY, s(&uuid::Uuid::now_v7().to_string()))
            .item("scope", s(&key.scope))
            .item("operation", s(&key.operation))
            .item("rkey", s(&key.key))
            .item("created_at", AttributeValue::N(now.to_string()))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PARTITION_KEY)
            .build()
            .expect("table and item are set");
        TransactWriteItem::builder().put(put).build()
    }

    /// Submits `new` with its handoff in one transaction. A repeated
    /// submission returns the existing task and writes no second handoff.
    pub async fn submit(&self, new: NewTask) -> taskfence::Result<Submitted> {
        self.submit_with(new, Vec::new()).await
    }

    /// [`submit`](Self::submit) with the application's own items (the user's
    /// message) in the same transaction.
    pub async fn submit_with(
        &self,
        new: NewTask,
        mut extra: Vec<TransactWriteItem>,
    ) -> taskfence::Result<Submitted> {
        extra.push(self.handoff(&new.key));
        self.store.with(extra).submit(new).await
    }

    /// Up to `limit` pending handoffs, oldest first (one consistent `Query`
    /// per 1 MB page).
    pub async fn pending(&self, limit: usize) -> Result<Vec<Handoff>, BoxError> {
        let mut handoffs = Vec::new();
        let mut start = None;
        while handoffs.len() < limit {
            let page = self
                .client()
                .query()
                .table_name(self.table())
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", PARTITION_KEY)
                .expression_attribute_values(":pk", AttributeValue::S(OUTBOX_PARTITION.into()))
                .consistent_read(true)
                .limit(i32::try_from(limit - handoffs.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(sdk)?;
            for item in page.items() {
                handoffs.push(parse(item)?);
            }
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        Ok(handoffs)
    }

    /// The task a handoff names; `None` when it is gone (purged after its
    /// retention: nothing left to publish).
    pub async fn task_of(&self, handoff: &Handoff) -> Result<Option<TaskId>, BoxError> {
        Ok(self.store.find(&handoff.key).await?.map(|task| task.id))
    }

    /// Deletes published handoffs, 25 per `BatchWriteItem`. A delete that
    /// does not happen leaves the handoff pending: the next round publishes it
    /// again, which is harmless.
    pub async fn remove(&self, handoffs: &[&Handoff]) -> Result<(), BoxError> {
        for chunk in handoffs.chunks(MAX_DELETES) {
            let mut requests = chunk
                .iter()
                .map(|handoff| {
                    let delete = DeleteRequest::builder()
                        .key(PARTITION_KEY, AttributeValue::S(OUTBOX_PARTITION.into()))
                        .key(SORT_KEY, AttributeValue::S(handoff.id.clone()))
                        .build()
                        .map_err(sdk)?;
                    Ok(WriteRequest::builder().delete_request(delete).build())
                })
                .collect::<Result<Vec<_>, BoxError>>()?;
            // DynamoDB may leave some of a batch unprocessed (throttling): send
            // those again, a few times.
            for _ in 0..5 {
                let out = self
                    .client()
                    .batch_write_item()
                    .request_items(self.table(), requests)
                    .send()
                    .await
                    .map_err(sdk)?;
                requests = out
                    .unprocessed_items()
                    .and_then(|left| left.get(self.table()))
                    .cloned()
                    .unwrap_or_default();
                if requests.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            if !requests.is_empty() {
                return Err(format!("{} handoff deletes left unprocessed", requests.len()).into());
            }
        }
        Ok(())
    }
}

fn parse(item: &HashMap<String, AttributeValue>) -> Result<Handoff, BoxError> {
    let s = |name: &str| -> Result<String, BoxError> {
        item.get(name)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .ok_or_else(|| format!("handoff item without {name}: {item:?}").into())
    };
    Ok(Handoff {
        id: s(SORT_KEY)?,
        key: RequestKey::new(s("scope")?, s("operation")?, s("rkey")?),
    })
}
