//! The operator's reads, bounded: listings read task items without their
//! payload and response (a projection), filtered listings examine a
//! limited number of index entries, and counts stop at a cap.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{KeysAndAttributes, Select};

use crate::error::{Error, InvalidInput, Result};
use crate::inspect::{Count, TaskSummary};
use crate::task::{Status, TaskId};

use super::item::{self, Item, s};
use super::read::{BATCH_GET, task_id_of};
use super::store::DynamoStore;
use super::table::{PARTITION_KEY, STATUS_INDEX};
use super::tx::{CONFLICT_RETRIES, Raced, pause, sdk};

/// Most `status` index entries one status's filtered listing examines
/// before it refuses ([`InvalidInput::TooBroad`]): the index serves the
/// status, not the scope, operation or window, which DynamoDB filters
/// after reading (and bills).
pub(super) const MAX_EXAMINED: usize = 10_000;

/// Every attribute [`item::task`] reads but the payload and the response.
const SUMMARY_ATTRIBUTES: [&str; 25] = [
    PARTITION_KEY,
    item::TASK_ID,
    item::SCOPE,
    item::OPERATION,
    item::RKEY,
    item::INPUT_HASH,
    item::STATUS,
    item::VERSION,
    item::MAX_ATTEMPTS,
    item::INITIAL_BACKOFF,
    item::MAX_BACKOFF,
    item::MULTIPLIER,
    item::JITTER,
    item::DEADLINE,
    item::ON_AMBIGUOUS,
    item::ACCEPTANCE,
    item::LEASE_UNTIL,
    item::NOT_BEFORE,
    item::LAST_ERROR,
    item::CREATED_AT,
    item::FINISHED_AT,
    item::EXPIRES_AT,
    item::BUDGET_BASE,
    item::BUDGET_STARTED_AT,
    item::TRACE_CONTEXT,
];

/// The refusal of a filtered listing that examined [`MAX_EXAMINED`] entries
/// of one status without filling its page.
pub(super) fn too_broad() -> Error {
    Error::InvalidInput(InvalidInput::TooBroad {
        examined: MAX_EXAMINED,
    })
}

impl DynamoStore {
    /// The summaries of the tasks `ids` that exist, by id: consistent
    /// `BatchGetItem`s of the task items projected to [`SUMMARY_ATTRIBUTES`].
    pub(super) async fn batch_get_summaries(&self, ids: &[TaskId]) -> Result<HashMap<TaskId, TaskSummary>> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let chunks: Vec<Vec<TaskId>> = ids.chunks(BATCH_GET).map(<[TaskId]>::to_vec).collect();
        let read = Self::concurrently(chunks.len(), |i| {
            let (store, chunk) = (self.clone(), chunks[i].clone());
            async move {
                let keys = chunk
                    .iter()
                    .map(|id| item::key_of(item::task_pk(*id), item::TASK_SK))
                    .collect();
                store.batch_get_projected(keys).await
            }
        })
        .await?;
        let mut found = HashMap::with_capacity(ids.len());
        for items in read {
            for found_item in items? {
                let task = item::task(&found_item).map_err(Error::storage)?;
                found.insert(task_id_of(&found_item)?, TaskSummary::from(task));
            }
        }
        Ok(found)
    }

    /// One projected `BatchGetItem` of at most 100 keys, asking again for
    /// the keys DynamoDB leaves unprocessed.
    async fn batch_get_projected(&self, mut keys: Vec<Item>) -> Result<Vec<Item>> {
        let names: HashMap<String, String> = SUMMARY_ATTRIBUTES
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("#a{i}"), (*a).to_owned()))
            .collect();
        let projection = (0..SUMMARY_ATTRIBUTES.len())
            .map(|i| format!("#a{i}"))
            .collect::<Vec<_>>()
            .join(", ");
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
            let wanted = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true)
                .projection_expression(&projection)
                .set_expression_attribute_names(Some(names.clone()))
                .build()
                .expect("keys are set");
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

    /// Tasks in `status` (of `scope`), counted up to `cap`: `Select=COUNT`
    /// pages of the status's index partition that evaluate at most `cap`
    /// entries in all. [`Count::AtLeast`] what matched when it stopped there.
    pub(super) async fn count_status_up_to(
        &self,
        status: Status,
        scope: Option<String>,
        cap: u64,
    ) -> Result<Count> {
        let (mut matched, mut examined) = (0u64, 0u64);
        let mut start = None;
        loop {
            let mut request = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(STATUS_INDEX)
                .select(Select::Count)
                .key_condition_expression("#status = :status")
                .expression_attribute_names("#status", item::STATUS)
                .expression_attribute_values(":status", s(status.as_str()))
                .limit(i32::try_from(cap - examined).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start);
            if let Some(scope) = &scope {
                request = request
                    .filter_expression("#scope = :scope")
                    .expression_attribute_names("#scope", item::SCOPE)
                    .expression_attribute_values(":scope", s(scope));
            }
            let page = request.send().await.map_err(sdk)?;
            matched += u64::try_from(page.count()).unwrap_or(0);
            examined += u64::try_from(page.scanned_count()).unwrap_or(0);
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(Count::Exact(matched));
            }
            if examined >= cap {
                return Ok(Count::AtLeast(matched));
            }
        }
    }
}
