//! An operator's reopening of a failed or cancelled task: the task, its
//! dedup record (live again) and the reopening item in one transaction
//! conditioned on the state read.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

use crate::backend::rules::{self, ReopenRule};
use crate::error::{Error, Result};
use crate::store::{Fenced, Rejection, ReopenRequest, Reopening};
use crate::task::{Status, Task, TaskId};

use super::expr::{Expr, unchanged};
use super::item::{self, at, b, n, s};
use super::store::DynamoStore;
use super::table::{
    DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY, PURGE_AT, PURGE_SHARD, TTL, UNCLAIMED_AT, UNCLAIMED_INDEX,
    UNCLAIMED_SHARD,
};
use super::tx::{Layout, RACE_RETRIES, Raced, Tx};

impl DynamoStore {
    /// Reads the task, decides with [`rules::reopen`], and writes the
    /// reopened task, its dedup record (live again: no TTL, retention
    /// restarted) and the reopening item in one transaction conditioned on
    /// the state read, like a cancellation; a refusal decides again on its image.
    ///
    /// A task a purge has claimed (its retention passed) is gone for a
    /// reopening: [`Error::NotFound`], as once the purge has finished.
    pub(super) async fn reopen_task(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let mut found = self.read_item(id).await?.ok_or(Error::NotFound(id))?;
        let mut task = item::task(&found).map_err(Error::storage)?;
        let mut reopenings = item::reopenings(&found).map_err(Error::storage)?;
        let pk = item::task_pk(id);
        for _ in 0..RACE_RETRIES {
            if item::purging(&found) {
                return Err(Error::NotFound(id));
            }
            if let ReopenRule::Answer(rejection) = rules::reopen(&task) {
                return Ok(Fenced::Rejected(rejection));
            }
            let now = self.now();
            let mut next = task.clone();
            rules::reopened(&mut next, now, request.policy_for(&task.policy));
            let reopening = Reopening {
                task_id: id,
                number: reopenings + 1,
                at: now,
                by: request.by.clone(),
                reason: request.reason.clone(),
                from: task.status,
                version: task.version,
            };
            // Pending and due at once (in the due index, so a republish
            // loop publishes it), out of the purge index, a fresh budget.
            let mut e = unchanged(Expr::default(), &task)
                .cond("attribute_not_exists(#purging)", &[item::PURGING], Vec::new())
                .set(item::STATUS, s(Status::Pending.as_str()))
                .set(item::NOT_BEFORE, at(now))
                .set(DUE_SHARD, s(DUE_INDEX))
                .set(DUE_AT, at(now))
                .set(item::BUDGET_BASE, n(next.budget_base))
                .set(item::BUDGET_STARTED_AT, at(next.budget_started_at))
                .set(item::EXPIRES_AT, at(next.expires_at))
                .set(item::REOPENINGS, n(reopening.number))
                .remove(item::LEASE_UNTIL)
                .remove(item::FINISHED_AT)
                .remove(PURGE_SHARD)
                .remove(PURGE_AT);
            if next.version == 0 {
                // Cancelled before any claim: unclaimed again, so `stranded` sees it.
                e = e
                    .set(UNCLAIMED_SHARD, s(UNCLAIMED_INDEX))
                    .set(UNCLAIMED_AT, item::unclaimed_at(&next));
            }
            if next.policy != task.policy {
                for (name, value) in item::policy_attributes(&next.policy) {
                    e = match value {
                        Some(value) => e.set(name, value),
                        None => e.remove(name),
                    };
                }
            }
            // The dedup record guards the key again for the new retention.
            // Should DynamoDB's TTL have deleted it already, it is put back.
            let record = Expr::default()
                .set(item::TASK_ID, s(id.to_string()))
                .set(item::INPUT_HASH, b(task.input_hash.as_bytes().to_vec()))
                .set(item::EXPIRES_AT, at(next.expires_at))
                .remove(TTL)
                .cond(
                    "attribute_not_exists(#pk) OR #task_id = :c_task",
                    &[PARTITION_KEY, item::TASK_ID],
                    vec![(":c_task", s(id.to_string()))],
                );
            let put = Put::builder()
                .table_name(&*self.table)
                .set_item(Some(item::reopening_item(&reopening)))
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PARTITION_KEY)
                .build()
                .expect("table and item are set");
            let mut items = vec![
                e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                record.update(&self.table, item::key_of(item::key_pk(&task.key), item::KEY_SK)),
                TransactWriteItem::builder().put(put).build(),
            ];
            if item::wants_handoff(&found) {
                // A fresh handoff, so the dispatcher publishes the task again.
                items.push(self.handoff_put(id, now));
            }
            if let Some(key) = &task.limits.concurrency {
                // Unfinished again, in its old place: a limit-1 key's walk
                // starts from the beginning again, and a claim of the key
                // decided before this reopening does not commit.
                items.push(
                    Expr::default()
                        .add_to(item::VERSION, 1)
                        .set(item::FIRST_FROM, n(0))
                        .update(
                            &self.table,
                            item::key_of(item::conc_pk(key.name()), item::CONC_SK),
                        ),
                );
            }
            match self.transact("reopen", items, Layout::key_at(1)).await? {
                Tx::Written => return Ok(Fenced::Accepted(next)),
                Tx::Refused(None) => return Err(Error::NotFound(id)),
                Tx::KeyTaken(record) => {
                    // DynamoDB's TTL removed the record and a new submission
                    // took the key: reopening would give one key two live tasks.
                    let Some(Ok((current, _))) = record.as_ref().map(item::dedup) else {
                        return Err(Error::storage(Raced("reopen")));
                    };
                    return Ok(Fenced::Rejected(Rejection::KeyReused { current }));
                }
                Tx::Refused(Some(old)) => {
                    task = item::task(&old).map_err(Error::storage)?;
                    reopenings = item::reopenings(&old).map_err(Error::storage)?;
                    found = old;
                }
                Tx::RecordChanged => unreachable!("a reopening names no other item"),
            }
        }
        Err(Error::storage(Raced("reopen")))
    }
}
