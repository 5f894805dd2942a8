//! Retention: `purge_expired`, a task at a time, each claimed by a mark
//! before anything of it is deleted, so a purge never races a reopening
//! and an interrupted one is resumed by the next.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{DeleteRequest, ReturnValue, WriteRequest};
use time::OffsetDateTime;

use crate::error::{Error, Result};
use crate::task::{RequestKey, Status, TaskId};

use super::item::{self, at, s};
use super::store::DynamoStore;
use super::table::{PARTITION_KEY, PURGE_AT, PURGE_INDEX, PURGE_SHARD, SORT_KEY};
use super::tx::{CONFLICT_RETRIES, Raced, pause, sdk};

/// Deletes per `BatchWriteItem`, DynamoDB's maximum.
pub(super) const BATCH_DELETE: usize = 25;

impl DynamoStore {
    /// [`purge_expired`](crate::TaskStore::purge_expired): up to `limit` candidates
    /// from the eventually consistent `purge` index, each purged on its own.
    pub(super) async fn purge(&self, limit: usize) -> Result<u64> {
        let now = self.now();
        let entries = self
            .query_all(
                Some(PURGE_INDEX),
                "#shard = :shard AND #at <= :now",
                HashMap::from([
                    ("#shard".to_owned(), PURGE_SHARD.to_owned()),
                    ("#at".to_owned(), PURGE_AT.to_owned()),
                ]),
                HashMap::from([
                    (":shard".to_owned(), s(PURGE_INDEX)),
                    (":now".to_owned(), at(now)),
                ]),
                Some(limit),
            )
            .await?;
        let (mut purged, mut failed) = (0, None);
        for entry in &entries {
            let pk = entry
                .get(PARTITION_KEY)
                .and_then(|v| v.as_s().ok())
                .map_or("", String::as_str);
            let id = item::task_id_of_pk(pk).map_err(Error::storage)?;
            let key = item::request_key(entry).map_err(Error::storage)?;
            match self.purge_one(id, &key, now).await {
                Ok(true) => purged += 1,
                Ok(false) => {}
                // One task's trouble (throttling that outlasted the retries)
                // does not hold up the rest; its entry stays for the next run.
                Err(e) => {
                    tracing::warn!(task_id = %id, error = %e, "could not purge a task; the next purge tries again");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if purged == 0 => Err(e),
            _ => Ok(purged),
        }
    }

    /// Removes one expired terminal task. First the purge claims it: a mark
    /// on the task item that only a terminal task past its retention accepts
    /// and that a reopening refuses, so nothing below runs under a task that
    /// lives again. Then its dedup record (only if it is still this task's),
    /// its attempts and reopenings, and the task item last: an interrupted
    /// purge leaves the task marked and in the purge index, and the next one
    /// claims it again (the mark passes its own condition) and finishes.
    pub(super) async fn purge_one(&self, id: TaskId, key: &RequestKey, now: OffsetDateTime) -> Result<bool> {
        let expired = "#status IN (:completed, :failed, :cancelled) AND #expires_at <= :now";
        let claimed = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(item::key_of(item::task_pk(id), item::TASK_SK)))
            .update_expression("SET #purging = if_not_exists(#purging, :now)")
            .condition_expression(expired)
            .expression_attribute_names("#status", item::STATUS)
            .expression_attribute_names("#expires_at", item::EXPIRES_AT)
            .expression_attribute_names("#purging", item::PURGING)
            .expression_attribute_values(":completed", s(Status::Completed.as_str()))
            .expression_attribute_values(":failed", s(Status::Failed.as_str()))
            .expression_attribute_values(":cancelled", s(Status::Cancelled.as_str()))
            .expression_attribute_values(":now", at(now))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        // A task of a concurrency key: its member item goes with its attempts.
        let member = match claimed {
            Ok(out) => out.attributes().and_then(|task| {
                let key = task.get(item::CONCURRENCY_KEY)?.as_s().ok()?;
                let order = item::key_order(task).ok()??;
                Some(item::key_of(item::conc_pk(key), &item::member_sk(order)))
            }),
            // Reopened (or purged) since the index listed it: not expired work.
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                return Ok(false);
            }
            Err(err) => return Err(sdk(err)),
        };
        let dedup = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(item::key_of(item::key_pk(key), item::KEY_SK)))
            .condition_expression("#task_id = :id")
            .expression_attribute_names("#task_id", item::TASK_ID)
            .expression_attribute_values(":id", s(id.to_string()))
            .send()
            .await;
        if let Err(err) = dedup {
            // Gone already (TTL) or reused by a newer task after TTL: not ours to delete.
            if !err
                .as_service_error()
                .is_some_and(|e| e.is_conditional_check_failed_exception())
            {
                return Err(sdk(err));
            }
        }
        let mut children = self.child_items(id).await?;
        children.extend(member);
        for chunk in children.chunks(BATCH_DELETE) {
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|a| {
                    let key = a
                        .iter()
                        .filter(|(k, _)| *k == PARTITION_KEY || *k == SORT_KEY)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    WriteRequest::builder()
                        .delete_request(
                            DeleteRequest::builder()
                                .set_key(Some(key))
                                .build()
                                .expect("key is set"),
                        )
                        .build()
                })
                .collect();
            for tries in 0..=CONFLICT_RETRIES {
                if requests.is_empty() {
                    break;
                }
                if tries > 0 {
                    // Unprocessed (throttled): the rest after a pause.
                    tokio::time::sleep(pause(tries)).await;
                }
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&*self.table, requests.clone())
                    .send()
                    .await
                    .map_err(sdk)?;
                requests = out
                    .unprocessed_items()
                    .and_then(|u| u.get(&*self.table))
                    .cloned()
                    .unwrap_or_default();
            }
            if !requests.is_empty() {
                return Err(Error::storage(Raced("purge_expired")));
            }
        }
        let deleted = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .set_key(Some(item::key_of(item::task_pk(id), item::TASK_SK)))
            .condition_expression("attribute_exists(#purging)")
            .expression_attribute_names("#purging", item::PURGING)
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(err) => Err(sdk(err)),
        }
    }
}
