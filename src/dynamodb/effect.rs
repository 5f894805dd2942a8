//! The effect journal: one item per effect in the task's partition
//! (`sk = E#<name>`). `begin_effect` and `finish_effect` read the task and
//! the effect item in one `TransactGetItems` (a snapshot: the fence and the
//! record as of one instant), decide with the shared
//! [`rules`](crate::backend::rules), and write with one `TransactWriteItems`:
//! the lease's fence as a `ConditionCheck` on the task item, and a `Put` of
//! the effect item on the condition that the record is still the one read.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use time::OffsetDateTime;

use crate::backend::rules::{self, BeginEffectRule, FinishEffectRule};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, Result};
use crate::store::{Fenced, Lease};
use crate::task::TaskId;

use super::expr::{Expr, fence};
use super::item::{self, Item, n, s};
use super::store::DynamoStore;
use super::table::PARTITION_KEY;
use super::tx::{Layout, RACE_RETRIES, Raced, Tx};

impl DynamoStore {
    /// [`begin_effect`](crate::TaskStore::begin_effect): the intent, when
    /// [`rules::begin_effect`] says to record one.
    pub(super) async fn begin_effect_step(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        self.effect_step("begin_effect", lease, name, |recorded, now| {
            Ok(match rules::begin_effect(recorded, lease, name, now) {
                BeginEffectRule::Write { effect, start } => (Some(effect), start),
                BeginEffectRule::Answer(start) => (None, start),
            })
        })
        .await
    }

    /// [`finish_effect`](crate::TaskStore::finish_effect): the outcome, when
    /// [`rules::finish_effect`] says to record it.
    pub(super) async fn finish_effect_step(
        &self,
        lease: &Lease,
        name: &str,
        outcome: &EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        self.effect_step("finish_effect", lease, name, |recorded, now| {
            Ok(match rules::finish_effect(recorded, lease, name, outcome, now)? {
                FinishEffectRule::Write(effect) => (Some(effect.clone()), effect),
                FinishEffectRule::Answer(effect) => (None, effect),
            })
        })
        .await
    }

    /// [`effects`](crate::TaskStore::effects): the task's effect items, by
    /// name (their sort keys' order), in one consistent query per 1 MB page.
    pub(super) async fn effect_records(&self, id: TaskId) -> Result<Vec<Effect>> {
        self.prefixed_items(id, item::EFFECT_PREFIX)
            .await?
            .iter()
            .map(|found| item::effect(found, id).map_err(Error::storage))
            .collect()
    }

    /// One step of the journal: read the task and the effect's record as of
    /// one instant, classify a failing fence with [`rules::fence`], `decide`
    /// (a record to store, if any, and the answer), and store it under the
    /// fence, on the condition that the record is the one read. A refused
    /// fence is classified from the task's `ALL_OLD` image; a record that
    /// changed since the read (another call of the same assignment) is read
    /// and decided again, at most [`RACE_RETRIES`] times.
    async fn effect_step<T>(
        &self,
        op: &'static str,
        lease: &Lease,
        name: &str,
        decide: impl Fn(Option<&Effect>, OffsetDateTime) -> Result<(Option<Effect>, T)>,
    ) -> Result<Fenced<T>> {
        let id = lease.task_id();
        let pk = item::task_pk(id);
        let keys = [
            item::key_of(pk.clone(), item::TASK_SK),
            item::key_of(pk, &item::effect_sk(name)),
        ];
        for _ in 0..RACE_RETRIES {
            let now = self.now();
            let mut read = self.transact_get(op, &keys).await?.into_iter();
            let (Some(task), recorded) = (read.next().flatten(), read.next().flatten()) else {
                return Err(Error::NotFound(id));
            };
            let task = item::task(&task).map_err(Error::storage)?;
            if let Err(rejection) = rules::fence(&task, lease.version(), now) {
                tracing::debug!(%rejection, "effect rejected");
                return Ok(Fenced::Rejected(rejection));
            }
            let recorded = recorded
                .map(|found| item::effect(&found, id).map_err(Error::storage))
                .transpose()?;
            let (write, answer) = decide(recorded.as_ref(), now)?;
            let Some(effect) = write else {
                return Ok(Fenced::Accepted(answer));
            };
            let items = vec![
                fence(Expr::default(), lease.version(), now).check(&self.table, keys[0].clone()),
                self.effect_put(&effect, recorded.as_ref()),
            ];
            match self.transact(op, items, Layout::record_at(1)).await? {
                Tx::Written => return Ok(Fenced::Accepted(answer)),
                Tx::Refused(None) => return Err(Error::NotFound(id)),
                Tx::Refused(Some(old)) => {
                    let old = item::task(&old).map_err(Error::storage)?;
                    if let Err(rejection) = rules::fence(&old, lease.version(), now) {
                        tracing::debug!(%rejection, "effect rejected");
                        return Ok(Fenced::Rejected(rejection));
                    }
                }
                // Another call of this assignment wrote the record first.
                Tx::RecordChanged => tracing::debug!("effect record changed since the read; deciding again"),
                Tx::KeyTaken(_) => unreachable!("an effect's transaction names no dedup record"),
            }
        }
        Err(Error::storage(Raced(op)))
    }

    /// The put of `effect`'s item in place of the record read: only if it
    /// is still absent, or still in the state and version read (every write
    /// of the journal changes one of the two).
    fn effect_put(&self, effect: &Effect, read: Option<&Effect>) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item::effect_item(effect)));
        let put = match read {
            None => put
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PARTITION_KEY),
            Some(read) => put
                .condition_expression("#state = :c_state AND #version = :c_version")
                .expression_attribute_names("#state", item::STATE)
                .expression_attribute_names("#version", item::VERSION)
                .expression_attribute_values(":c_state", s(read.state.as_str()))
                .expression_attribute_values(":c_version", n(read.version)),
        };
        let put = put.build().expect("table and item are set");
        TransactWriteItem::builder().put(put).build()
    }
}

/// The effects among a task partition's `items` (a story's query), by name.
pub(super) fn effects_of(items: &[Item], id: TaskId) -> Result<Vec<Effect>> {
    items
        .iter()
        .filter(|found| super::read::sort_key(found).starts_with(item::EFFECT_PREFIX))
        .map(|found| item::effect(found, id).map_err(Error::storage))
        .collect()
}
