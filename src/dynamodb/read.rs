//! Reads: consistent gets, batch gets and transactional gets, paginated
//! queries of a task's partition and of the queue indexes, and running a
//! batch's requests side by side.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_get_items::TransactGetItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Get, KeysAndAttributes, TransactGetItem};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::task::{Task, TaskId};

use super::item::{self, Item, at, s};
use super::store::DynamoStore;
use super::table::{DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY, SORT_KEY, UNCLAIMED_INDEX, UNCLAIMED_SHARD};
use super::tx::{CONFLICT_RETRIES, Raced, pause, sdk};

/// Keys per `BatchGetItem`, DynamoDB's maximum.
pub(super) const BATCH_GET: usize = 100;

/// Requests a batch operation (`claim_many`, `complete_many`, the reads of
/// a listing) has in flight at once.
pub(super) const CONCURRENCY: usize = 32;

impl DynamoStore {
    pub(super) async fn read_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.read_item(id)
            .await?
            .map(|i| item::task(&i).map_err(Error::storage))
            .transpose()
    }

    /// The task item, read consistently.
    pub(super) async fn read_item(&self, id: TaskId) -> Result<Option<Item>> {
        let out = self
            .client
            .get_item()
            .table_name(&*self.table)
            .set_key(Some(item::key_of(item::task_pk(id), item::TASK_SK)))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        Ok(out.item)
    }

    /// The items of `keys` as of one instant (`TransactGetItems`: one
    /// request, a snapshot no write lands in the middle of), in the order
    /// of `keys`; `None` for a missing item. A read cancelled because a
    /// transaction held an item, or by throttling, is asked again after a pause.
    pub(super) async fn transact_get(&self, op: &'static str, keys: &[Item]) -> Result<Vec<Option<Item>>> {
        let gets: Vec<TransactGetItem> = keys
            .iter()
            .map(|key| {
                let get = Get::builder()
                    .table_name(&*self.table)
                    .set_key(Some(key.clone()))
                    .build()
                    .expect("table and key are set");
                TransactGetItem::builder().get(get).build()
            })
            .collect();
        let mut conflicts = 0;
        loop {
            let sent = self
                .client
                .transact_get_items()
                .set_transact_items(Some(gets.clone()))
                .send()
                .await;
            let err = match sent {
                Ok(out) => {
                    let mut items: Vec<Option<Item>> =
                        out.responses().iter().map(|r| r.item().cloned()).collect();
                    items.resize(keys.len(), None);
                    return Ok(items);
                }
                Err(err) => err,
            };
            let transient = matches!(
                &err,
                SdkError::ServiceError(service)
                    if matches!(service.err(), TransactGetItemsError::TransactionCanceledException(c)
                        if c.cancellation_reasons().iter().any(|r| matches!(
                            r.code(),
                            Some("TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded")
                        )))
            );
            if !transient {
                return Err(sdk(err));
            }
            conflicts += 1;
            if conflicts > CONFLICT_RETRIES {
                return Err(Error::storage(Raced(op)));
            }
            tokio::time::sleep(pause(conflicts)).await;
        }
    }

    pub(super) async fn query_all(
        &self,
        index: Option<&str>,
        condition: &str,
        names: HashMap<String, String>,
        values: HashMap<String, AttributeValue>,
        limit: Option<usize>,
    ) -> Result<Vec<Item>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page_limit = limit.map(|l| i32::try_from(l - out.len()).unwrap_or(i32::MAX));
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .set_index_name(index.map(str::to_owned))
                .key_condition_expression(condition)
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .set_limit(page_limit)
                .consistent_read(index.is_none())
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(sdk)?;
            out.extend(page.items().iter().cloned());
            start = page.last_evaluated_key().cloned();
            if start.is_none() || limit.is_some_and(|l| out.len() >= l) {
                return Ok(out);
            }
        }
    }

    /// The items of task `id`'s partition whose sort key starts with
    /// `prefix` (`A#` attempts, `E#` effects), in sort-key order: one
    /// consistent query per 1 MB page.
    pub(super) async fn prefixed_items(&self, id: TaskId, prefix: &str) -> Result<Vec<Item>> {
        self.query_all(
            None,
            "#pk = :pk AND begins_with(#sk, :prefix)",
            HashMap::from([
                ("#pk".to_owned(), PARTITION_KEY.to_owned()),
                ("#sk".to_owned(), SORT_KEY.to_owned()),
            ]),
            HashMap::from([
                (":pk".to_owned(), s(item::task_pk(id))),
                (":prefix".to_owned(), s(prefix)),
            ]),
            None,
        )
        .await
    }

    /// A task's attempt and reopening items: every item of its partition
    /// that sorts before the task item (`A#…`, `R#…` < `T`).
    pub(super) async fn child_items(&self, id: TaskId) -> Result<Vec<Item>> {
        self.query_all(
            None,
            "#pk = :pk AND #sk < :task",
            HashMap::from([
                ("#pk".to_owned(), PARTITION_KEY.to_owned()),
                ("#sk".to_owned(), SORT_KEY.to_owned()),
            ]),
            HashMap::from([
                (":pk".to_owned(), s(item::task_pk(id))),
                (":task".to_owned(), s(item::TASK_SK)),
            ]),
            None,
        )
        .await
    }

    /// Up to `limit` ids from the due index: a backoff passed, a lease
    /// expired, a release or a reopening, by `now`; earliest first.
    pub(super) async fn due_ids(&self, now: OffsetDateTime, limit: usize) -> Result<Vec<TaskId>> {
        let entries = self
            .query_all(
                Some(DUE_INDEX),
                "#shard = :shard AND #at <= :now",
                HashMap::from([
                    ("#shard".to_owned(), DUE_SHARD.to_owned()),
                    ("#at".to_owned(), DUE_AT.to_owned()),
                ]),
                HashMap::from([(":shard".to_owned(), s(DUE_INDEX)), (":now".to_owned(), at(now))]),
                Some(limit),
            )
            .await?;
        entries.iter().map(task_id_of).collect()
    }

    /// Up to `limit` ids from the unclaimed index: never claimed, oldest first.
    pub(super) async fn unclaimed_ids(&self, limit: usize) -> Result<Vec<TaskId>> {
        let entries = self
            .query_all(
                Some(UNCLAIMED_INDEX),
                "#shard = :shard",
                HashMap::from([("#shard".to_owned(), UNCLAIMED_SHARD.to_owned())]),
                HashMap::from([(":shard".to_owned(), s(UNCLAIMED_INDEX))]),
                Some(limit),
            )
            .await?;
        entries.iter().map(task_id_of).collect()
    }

    /// Runs `make(i)` for `i` in `0..n` as tasks of the runtime, at most
    /// [`CONCURRENCY`] at once, and returns their outputs in order. Dropping
    /// the returned future aborts what is still running.
    pub(super) async fn concurrently<T, Fut>(n: usize, mut make: impl FnMut(usize) -> Fut) -> Result<Vec<T>>
    where
        T: Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
    {
        let mut running = tokio::task::JoinSet::new();
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut next = 0;
        loop {
            while next < n && running.len() < CONCURRENCY {
                let future = make(next);
                let i = next;
                running.spawn(async move { (i, future.await) }.in_current_span());
                next += 1;
            }
            match running.join_next().await {
                None => break,
                Some(Ok((i, value))) => out[i] = Some(value),
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(e)) => return Err(Error::storage(e)),
            }
        }
        Ok(out
            .into_iter()
            .map(|v| v.expect("every task was joined"))
            .collect())
    }

    /// The task items of `ids`, read consistently with `BatchGetItem` (100
    /// keys per request, the requests concurrent; keys DynamoDB leaves
    /// unprocessed are asked again). A missing id has no entry.
    pub(super) async fn batch_get(&self, ids: &[TaskId]) -> Result<HashMap<TaskId, Item>> {
        self.batch_get_as(ids, None).await
    }

    /// [`batch_get`](Self::batch_get), each item read as `projection` has
    /// it (all of it without one).
    pub(super) async fn batch_get_as(
        &self,
        ids: &[TaskId],
        projection: Option<&Projection>,
    ) -> Result<HashMap<TaskId, Item>> {
        // DynamoDB refuses a request that names one key twice.
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let chunks: Vec<Vec<TaskId>> = ids.chunks(BATCH_GET).map(<[TaskId]>::to_vec).collect();
        let read = Self::concurrently(chunks.len(), |i| {
            let (store, chunk, projection) = (self.clone(), chunks[i].clone(), projection.cloned());
            async move {
                let keys = chunk
                    .iter()
                    .map(|id| item::key_of(item::task_pk(*id), item::TASK_SK))
                    .collect();
                store.batch_get_keys_as(keys, projection.as_ref()).await
            }
        })
        .await?;
        let mut found = HashMap::with_capacity(ids.len());
        for items in read {
            for item in items? {
                found.insert(task_id_of(&item)?, item);
            }
        }
        Ok(found)
    }

    /// One consistent `BatchGetItem` of at most 100 `keys` (any items of the
    /// table: tasks, handoffs); keys DynamoDB leaves unprocessed (throttled,
    /// or past 16 MB) are asked again after a pause.
    pub(super) async fn batch_get_keys(&self, keys: Vec<Item>) -> Result<Vec<Item>> {
        self.batch_get_keys_as(keys, None).await
    }

    /// [`batch_get_keys`](Self::batch_get_keys), each item read as
    /// `projection` has it (all of it without one).
    async fn batch_get_keys_as(
        &self,
        mut keys: Vec<Item>,
        projection: Option<&Projection>,
    ) -> Result<Vec<Item>> {
        let mut out = Vec::with_capacity(keys.len());
        let mut tries = 0;
        while !keys.is_empty() {
            if tries > 0 {
                if tries > CONFLICT_RETRIES {
                    return Err(Error::storage(Raced("batch read")));
                }
                tokio::time::sleep(pause(tries)).await;
            }
            tries += 1;
            let mut wanted = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true);
            if let Some(projection) = projection {
                wanted = wanted
                    .projection_expression(&projection.expression)
                    .set_expression_attribute_names(Some(projection.names.clone()));
            }
            let wanted = wanted.build().expect("keys are set");
            let page = self
                .client
                .batch_get_item()
                .request_items(&*self.table, wanted)
                .send()
                .await
                .map_err(sdk)?;
            if let Some(items) = page.responses().and_then(|r| r.get(&*self.table)) {
                out.extend(items.iter().cloned());
            }
            keys = page
                .unprocessed_keys()
                .and_then(|u| u.get(&*self.table))
                .map(|k| k.keys().to_vec())
                .unwrap_or_default();
        }
        Ok(out)
    }
}

/// The attributes a read returns of each item (a `ProjectionExpression`
/// with its attribute names).
#[derive(Clone)]
pub(super) struct Projection {
    expression: String,
    names: HashMap<String, String>,
}

impl Projection {
    /// A projection to `attributes`.
    pub(super) fn of(attributes: &[&str]) -> Self {
        let names = attributes
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("#a{i}"), (*a).to_owned()))
            .collect();
        let expression = (0..attributes.len())
            .map(|i| format!("#a{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        Self { expression, names }
    }
}

/// The task id an index entry or item carries.
pub(super) fn task_id_of(entry: &Item) -> Result<TaskId> {
    let pk = entry
        .get(PARTITION_KEY)
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str);
    item::task_id_of_pk(pk).map_err(Error::storage)
}

/// An item's sort key.
pub(super) fn sort_key(found: &Item) -> &str {
    found
        .get(SORT_KEY)
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str)
}
