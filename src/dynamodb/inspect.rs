//! [`Inspect`](crate::inspect::Inspect) for [`DynamoStore`]: listings and
//! counts from the `status` index, stories from a task's partition,
//! stranded tasks from the sparse `unclaimed` index; tasks always as the
//! table has them.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::backend::InspectBackend;
use crate::backend::rules;
use crate::error::{Error, Result};
use crate::inspect::{
    CappedCounts, Count, Counts, Cursor, Order, Page, QueueDepth, Story, TaskQuery, TaskSummary,
};
use crate::task::{Status, TaskId};
use crate::throttle::{BucketState, KeySlots};

use super::bounded::{MAX_EXAMINED, too_broad};
use super::effect::effects_of;
use super::item::{self, at, s};
use super::read::{sort_key, task_id_of};
use super::store::DynamoStore;
use super::table::{PARTITION_KEY, STATUS_INDEX, UNCLAIMED_AT, UNCLAIMED_INDEX, UNCLAIMED_SHARD};
use super::tx::sdk;

/// Every status, in the order `list` merges and `counts` adds them.
pub(super) const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Running,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// The `status` index's filter expression for `query`'s scope, operation
/// and submission range (`None`: no filter, every entry matches).
pub(super) fn list_filter(
    query: &TaskQuery,
    names: &mut HashMap<String, String>,
    values: &mut HashMap<String, AttributeValue>,
) -> Option<String> {
    let mut clauses = Vec::new();
    let mut clause = |attr: &str, op: &str, value: AttributeValue| {
        names.insert(format!("#{attr}"), attr.to_owned());
        let placeholder = format!(":f_{}", clauses.len());
        clauses.push(format!("#{attr} {op} {placeholder}"));
        values.insert(placeholder, value);
    };
    if let Some(scope) = &query.scope {
        clause(item::SCOPE, "=", s(scope));
    }
    if let Some(operation) = &query.operation {
        clause(item::OPERATION, "=", s(operation));
    }
    if let Some(after) = query.created_after {
        clause(item::CREATED_AT, ">=", at(after));
    }
    if let Some(before) = query.created_before {
        clause(item::CREATED_AT, "<", at(before));
    }
    (!clauses.is_empty()).then(|| clauses.join(" AND "))
}

impl DynamoStore {
    /// Up to `want` ids of tasks in `status` that pass `query`'s filters and
    /// lie beyond its cursor, in its order, from the `status` index.
    pub(super) async fn status_ids(
        &self,
        status: Status,
        query: &TaskQuery,
        want: usize,
    ) -> Result<Vec<TaskId>> {
        let mut names = HashMap::from([("#status".to_owned(), item::STATUS.to_owned())]);
        let mut values = HashMap::from([(":status".to_owned(), s(status.as_str()))]);
        let mut key = "#status = :status".to_owned();
        if let Some(cursor) = query.after {
            let op = match query.order {
                Order::NewestFirst => "<",
                Order::OldestFirst => ">",
            };
            key.push_str(&format!(" AND #task_id {op} :cursor"));
            names.insert("#task_id".to_owned(), item::TASK_ID.to_owned());
            values.insert(":cursor".to_owned(), s(cursor.task_id().to_string()));
        }
        let filter = list_filter(query, &mut names, &mut values);
        // Unfiltered, the first `want` entries are the answer; filtered, read
        // pages until enough pass, examining at most `MAX_EXAMINED` entries.
        let page_limit = match filter {
            None => want,
            Some(_) => MAX_EXAMINED,
        };
        let mut ids = Vec::new();
        let mut examined = 0;
        let mut start = None;
        loop {
            let page_limit = Some(i32::try_from(page_limit - examined).unwrap_or(i32::MAX));
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(STATUS_INDEX)
                .key_condition_expression(&key)
                .set_filter_expression(filter.clone())
                .set_expression_attribute_names(Some(names.clone()))
                .set_expression_attribute_values(Some(values.clone()))
                .scan_index_forward(query.order == Order::OldestFirst)
                .set_limit(page_limit)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(sdk)?;
            for entry in page.items() {
                ids.push(task_id_of(entry)?);
            }
            examined += usize::try_from(page.scanned_count()).unwrap_or(0);
            start = page.last_evaluated_key().cloned();
            if start.is_none() || ids.len() >= want {
                ids.truncate(want);
                return Ok(ids);
            }
            if examined >= MAX_EXAMINED {
                return Err(too_broad());
            }
        }
    }

    /// How many tasks in `status` (of `scope`): `Select=COUNT` over the
    /// status's whole index partition, page by page (a count with no cap).
    pub(super) async fn count_status(&self, status: Status, scope: Option<String>) -> Result<u64> {
        match self.count_status_up_to(status, scope, u64::MAX).await? {
            Count::Exact(n) | Count::AtLeast(n) => Ok(n),
        }
    }
}

#[async_trait]
impl InspectBackend for DynamoStore {
    /// Every bucket: one consistent query of the buckets' partition.
    async fn buckets(&self) -> Result<Vec<BucketState>> {
        self.all_buckets().await
    }

    /// The key item's live holders, and its member items' pending tasks.
    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        self.key_slots(key).await
    }

    /// The status index's pending and running entries, on the store's clock.
    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        crate::backend::depth_from_listings(self, self.now()).await
    }

    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        let want = query.limit + 1;
        let statuses: Vec<Status> = query.status.map_or(STATUSES.to_vec(), |s| vec![s]);
        let found = Self::concurrently(statuses.len(), |i| {
            let (store, query, status) = (self.clone(), query.clone(), statuses[i]);
            async move { store.status_ids(status, &query, want).await }
        })
        .await?;
        // Each status's ids are in order: their merge is, too.
        let mut ids = Vec::new();
        for status_ids in found {
            ids.extend(status_ids?);
        }
        // A task whose status changed between the per-status queries sits
        // in two of them: once is enough (and `BatchGetItem` refuses duplicates).
        ids.sort_unstable();
        ids.dedup();
        if query.order == Order::NewestFirst {
            ids.reverse();
        }
        let more = ids.len() > query.limit;
        ids.truncate(query.limit);
        let mut items = self.batch_get_summaries(&ids).await?;
        let mut tasks = Vec::with_capacity(ids.len());
        for id in &ids {
            let Some(task) = items.remove(id) else { continue }; // purged meanwhile
            // The index lags the table a moment: the table's word is final.
            if query.matches_summary(&task) {
                tasks.push(task);
            }
        }
        let next = more.then(|| Cursor::from(ids[ids.len() - 1]));
        Ok(Page { tasks, next })
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        let scope = scope.map(str::to_owned);
        let counted = Self::concurrently(STATUSES.len(), |i| {
            let (store, scope) = (self.clone(), scope.clone());
            async move { store.count_status(STATUSES[i], scope).await }
        })
        .await?;
        let mut counts = Counts::default();
        for (status, n) in STATUSES.into_iter().zip(counted) {
            counts.add(status, n?);
        }
        Ok(counts)
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        let scope = scope.map(str::to_owned);
        let counted = Self::concurrently(STATUSES.len(), |i| {
            let (store, scope) = (self.clone(), scope.clone());
            async move { store.count_status_up_to(STATUSES[i], scope, cap).await }
        })
        .await?;
        let mut counts = CappedCounts::default();
        for (status, n) in STATUSES.into_iter().zip(counted) {
            counts.set(status, n?);
        }
        Ok(counts)
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        // The task's partition holds it all, in order: attempts (A#),
        // effects (E#, by name), handoffs (H#), reopenings (R#), the task
        // (T). One consistent query.
        let items = self
            .query_all(
                None,
                "#pk = :pk",
                HashMap::from([("#pk".to_owned(), PARTITION_KEY.to_owned())]),
                HashMap::from([(":pk".to_owned(), s(item::task_pk(id)))]),
                None,
            )
            .await?;
        let mut story = Story {
            task: match items.iter().find(|i| sort_key(i) == item::TASK_SK) {
                Some(found) => item::task(found).map_err(Error::storage)?,
                None => return Ok(None),
            },
            attempts: Vec::new(),
            reopenings: Vec::new(),
            handoffs: Vec::new(),
            effects: effects_of(&items, id)?,
        };
        for found in &items {
            let sk = sort_key(found);
            if sk.starts_with(item::ATTEMPT_PREFIX) {
                story
                    .attempts
                    .push(item::attempt(found, id).map_err(Error::storage)?);
            } else if sk.starts_with(item::REOPENING_PREFIX) {
                story
                    .reopenings
                    .push(item::reopening(found, id).map_err(Error::storage)?);
            } else if sk.starts_with(item::HANDOFF_PREFIX) {
                // Sorted by the instant written: oldest first.
                story.handoffs.push(item::handoff(found).map_err(Error::storage)?);
            }
        }
        Ok(Some(story))
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        let cutoff = self.now() - older_than;
        let mut stranded = Vec::new();
        let mut start = None;
        loop {
            let want = limit - stranded.len();
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(UNCLAIMED_INDEX)
                .key_condition_expression("#shard = :shard AND #at < :before")
                .expression_attribute_names("#shard", UNCLAIMED_SHARD)
                .expression_attribute_names("#at", UNCLAIMED_AT)
                .expression_attribute_values(":shard", s(UNCLAIMED_INDEX))
                .expression_attribute_values(":before", item::unclaimed_before(cutoff))
                .limit(i32::try_from(want).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(sdk)?;
            let ids = page.items().iter().map(task_id_of).collect::<Result<Vec<_>>>()?;
            let mut found = self.batch_get_summaries(&ids).await?;
            for id in ids {
                let Some(task) = found.remove(&id) else { continue };
                // Claimed or cancelled since the index saw it: not stranded.
                if rules::stranded(&task, cutoff) {
                    stranded.push(task);
                }
            }
            start = page.last_evaluated_key().cloned();
            if start.is_none() || stranded.len() >= limit {
                stranded.truncate(limit);
                return Ok(stranded);
            }
        }
    }
}
