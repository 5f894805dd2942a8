//! The operator's reads, bounded: listings read task items without their
//! payload and response (a projection), filtered listings examine a
//! limited number of index entries, and counts stop at a cap.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::Select;

use crate::error::{Error, InvalidInput, Result};
use crate::inspect::{Count, TaskSummary};
use crate::task::{Status, TaskId};

use super::item::{self, s};
use super::read::Projection;
use super::store::DynamoStore;
use super::table::{PARTITION_KEY, STATUS_INDEX};
use super::tx::sdk;

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
        let projection = Projection::of(&SUMMARY_ATTRIBUTES);
        let items = self.batch_get_as(ids, Some(&projection)).await?;
        items
            .into_iter()
            .map(|(id, found)| Ok((id, TaskSummary::from(item::task(&found).map_err(Error::storage)?))))
            .collect()
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
