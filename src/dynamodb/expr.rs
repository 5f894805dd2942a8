//! Update and condition expressions: [`Expr`], built one attribute at a
//! time, and the guards every write of the store carries (the fence, the
//! state a decision was made on, a claim's expiry or backoff, an attempt
//! item that must exist), plus the terminal move shared by completion,
//! failure and cancellation.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use time::OffsetDateTime;

use crate::store::AttemptOutcome;
use crate::task::{Status, Task};

use super::item::{self, Item, at, n, s};
use super::table::{
    DUE_AT, DUE_SHARD, PARTITION_KEY, PURGE_AT, PURGE_INDEX, PURGE_SHARD, UNCLAIMED_AT, UNCLAIMED_SHARD,
};

/// An update expression with its condition, names and values, built up one
/// attribute at a time (every name goes through `#name`: `status`, `key`,
/// `ttl` and friends are reserved words).
#[derive(Debug, Default)]
pub(super) struct Expr {
    set: Vec<String>,
    remove: Vec<String>,
    cond: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expr {
    pub(super) fn name(&mut self, attr: &str) -> String {
        let placeholder = format!("#{attr}");
        self.names.insert(placeholder.clone(), attr.to_owned());
        placeholder
    }
    pub(super) fn set(mut self, attr: &str, value: AttributeValue) -> Self {
        let name = self.name(attr);
        self.values.insert(format!(":{attr}"), value);
        self.set.push(format!("{name} = :{attr}"));
        self
    }
    /// Sets `attr` only where it has no value yet.
    pub(super) fn set_if_absent(mut self, attr: &str, value: AttributeValue) -> Self {
        let name = self.name(attr);
        self.values.insert(format!(":{attr}"), value);
        self.set.push(format!("{name} = if_not_exists({name}, :{attr})"));
        self
    }
    /// Adds `by` to the number `attr` (absent: 0), as part of this update.
    pub(super) fn add_to(mut self, attr: &str, by: u64) -> Self {
        let name = self.name(attr);
        self.values.insert(format!(":{attr}"), n(by));
        self.values.insert(format!(":{attr}_zero"), n(0));
        self.set
            .push(format!("{name} = if_not_exists({name}, :{attr}_zero) + :{attr}"));
        self
    }
    pub(super) fn remove(mut self, attr: &str) -> Self {
        let name = self.name(attr);
        self.remove.push(name);
        self
    }
    /// Adds a condition clause; `attrs` are the names it uses as `#attr`,
    /// `values` its `:placeholder`s.
    pub(super) fn cond(mut self, clause: &str, attrs: &[&str], values: Vec<(&str, AttributeValue)>) -> Self {
        for attr in attrs {
            self.name(attr);
        }
        self.values
            .extend(values.into_iter().map(|(k, v)| (k.to_owned(), v)));
        self.cond.push(format!("({clause})"));
        self
    }
    pub(super) fn update_expression(&self) -> String {
        let mut out = String::new();
        if !self.set.is_empty() {
            out.push_str("SET ");
            out.push_str(&self.set.join(", "));
        }
        if !self.remove.is_empty() {
            out.push_str(" REMOVE ");
            out.push_str(&self.remove.join(", "));
        }
        out
    }
    pub(super) fn condition(&self) -> Option<String> {
        (!self.cond.is_empty()).then(|| self.cond.join(" AND "))
    }
    pub(super) fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }
    pub(super) fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }

    /// This expression as a transaction item updating `key`.
    pub(super) fn update(self, table: &str, key: Item) -> TransactWriteItem {
        let update = Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(self.update_expression())
            .set_condition_expression(self.condition())
            .set_expression_attribute_names(self.names())
            .set_expression_attribute_values(self.values())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("key, table and expression are set");
        TransactWriteItem::builder().update(update).build()
    }

    /// This expression's condition as a transaction item checking `key`.
    pub(super) fn check(self, table: &str, key: Item) -> TransactWriteItem {
        let check = ConditionCheck::builder()
            .table_name(table)
            .set_key(Some(key))
            .condition_expression(self.condition().unwrap_or_default())
            .set_expression_attribute_names(self.names())
            .set_expression_attribute_values(self.values())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("key, table and condition are set");
        TransactWriteItem::builder().condition_check(check).build()
    }
}

/// The guard of a fenced write (guarantee 5), as a condition on the task item:
/// this assignment, still running, its lease unexpired on the writer's clock
/// (a running task has no response, so "no response yet" is implied).
pub(super) fn fence(e: Expr, version: u64, now: OffsetDateTime) -> Expr {
    e.cond(
        "#version = :c_version AND #status = :c_running AND #lease_until > :c_now",
        &[item::VERSION, item::STATUS, item::LEASE_UNTIL],
        vec![
            (":c_version", n(version)),
            (":c_running", s(Status::Running.as_str())),
            (":c_now", at(now)),
        ],
    )
}

/// The task item is still in the state a decision was made on: version,
/// status and retry budget fix every other mutable field of the item but the
/// lease expiry. (A reopening keeps the version and can bring back a status the
/// task had before; its new budget is what tells the two states apart.)
pub(super) fn unchanged(e: Expr, task: &Task) -> Expr {
    // Items from before the budget attributes lack them: that is the first budget.
    let base = if task.budget_base == 0 {
        "attribute_not_exists(#budget_base) OR #budget_base = :c_base"
    } else {
        "#budget_base = :c_base"
    };
    let started = if task.budget_started_at == task.created_at {
        "attribute_not_exists(#budget_started_at) OR #budget_started_at = :c_started"
    } else {
        "#budget_started_at = :c_started"
    };
    e.cond(
        "#version = :c_version AND #status = :c_status",
        &[item::VERSION, item::STATUS],
        vec![
            (":c_version", n(task.version)),
            (":c_status", s(task.status.as_str())),
        ],
    )
    .cond(base, &[item::BUDGET_BASE], vec![(":c_base", n(task.budget_base))])
    .cond(
        started,
        &[item::BUDGET_STARTED_AT],
        vec![(":c_started", at(task.budget_started_at))],
    )
}

/// The guard [`rules::claim`] passed on `task`, as a condition on the item: a
/// running task's lease has expired, a pending task's backoff has passed, on
/// this writer's clock. Both a claim and a budget-ending failure carry it, so
/// neither ends a lease someone renewed meanwhile.
pub(super) fn claimable(e: Expr, task: &Task, now: OffsetDateTime) -> Expr {
    match task.status {
        Status::Running => e.cond(
            "#lease_until <= :c_now",
            &[item::LEASE_UNTIL],
            vec![(":c_now", at(now))],
        ),
        _ => e.cond(
            "attribute_not_exists(#not_before) OR #not_before <= :c_now",
            &[item::NOT_BEFORE],
            vec![(":c_now", at(now))],
        ),
    }
}

/// An update of an attempt item that exists: a missing one (purged under a
/// concurrent writer) fails the transaction rather than leaving a partial item.
pub(super) fn attempt_update(e: Expr) -> Expr {
    e.cond("attribute_exists(#pk)", &[PARTITION_KEY], Vec::new())
}

/// Makes the task terminal, on the item and on the snapshot alike (the same
/// fields `MemoryStore` changes): no lease, no backoff, finished now, in the
/// purge index, out of the due and unclaimed indexes.
pub(super) fn terminal(
    mut e: Expr,
    task: &mut Task,
    status: Status,
    now: OffsetDateTime,
    error: Option<String>,
) -> Expr {
    task.status = status;
    task.lease_until = None;
    task.not_before = None;
    task.finished_at = Some(now);
    e = e
        .set(item::STATUS, s(status.as_str()))
        .set(item::FINISHED_AT, at(now))
        .set(PURGE_SHARD, s(PURGE_INDEX))
        .set(PURGE_AT, at(task.expires_at))
        .remove(item::LEASE_UNTIL)
        .remove(item::NOT_BEFORE)
        .remove(DUE_SHARD)
        .remove(DUE_AT)
        .remove(UNCLAIMED_SHARD)
        .remove(UNCLAIMED_AT);
    if let Some(error) = error {
        e = e.set(item::LAST_ERROR, s(&error));
        task.last_error = Some(error);
    }
    e
}

/// Ends attempt `number` with `outcome`, unless it has ended already.
pub(super) fn finish_if_running(outcome: AttemptOutcome, now: OffsetDateTime) -> Expr {
    attempt_update(Expr::default())
        .set_if_absent(item::FINISHED_AT, at(now))
        .set_if_absent(item::OUTCOME, s(outcome.as_str()))
}
