//! Concurrency keys and rate buckets on DynamoDB: what a claim decides its
//! limits on, read before its transaction, and the items it writes with
//! the claim on the condition that they are still as read; a submission's
//! place in its key's order; the operations on buckets.
//!
//! - A **key item** (`pk = C#<key>`, `sk = C`) carries a `version` that
//!   every claim of a task of the key raises, the **holders** of the key's
//!   slots (task id → the version that claimed it), `next_order` (the last
//!   submission order given) and `first_from` (every task of the key below
//!   that order is finished). A claim reads it, reads its holders' task
//!   items (a live lease holds a slot, on the store's clock) and, for a
//!   limit-1 key, the key's member items from `first_from` on; it decides
//!   with [`rules::within_limits`] and writes the key item back, holders
//!   pruned to the live ones plus itself, in the claim's own transaction
//!   on the condition that its `version` is unchanged. Two claims decided
//!   on one count cannot both commit.
//! - A **member item** (`pk = C#<key>`, `sk = O#<order>`) per task of the
//!   key, put by the submission in its transaction with the key item's
//!   `next_order` (conditioned on its value as read).
//! - A **bucket item** (`pk = B`, `sk = <name>`) carries the definition and
//!   the one GCRA `schedule` instant; a claim writes its new schedule on
//!   the condition that it is unchanged.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use time::OffsetDateTime;

use crate::backend::rules::{self, KeyLoad};
use crate::error::{Error, InvalidInput, Result};
use crate::task::{Status, Task, TaskId};
use crate::throttle::{BucketState, ConcurrencyKey, KeySlots, RateBucket};

use super::expr::Expr;
use super::item::{self, Item, at, n, s};
use super::read::Projection;
use super::store::DynamoStore;
use super::table::{PARTITION_KEY, SORT_KEY};
use super::tx::{Layout, Raced, Tx, pause, sdk};

/// Highest concurrency limit a task on DynamoDB may name: the key item
/// lists its slots' holders, and must stay well under the 400 KB item
/// limit (a claim also reads each holder's task item). Higher limits are
/// [`InvalidInput`], nothing written.
///
/// ```
/// assert!(taskfence::dynamodb::MAX_CONCURRENCY < taskfence::throttle::MAX_CONCURRENCY);
/// ```
pub const MAX_CONCURRENCY: u32 = 1_000;

/// How often a claim or submission whose key or bucket item changed
/// between its read and its transaction reads again and decides again.
pub(super) const LIMIT_RACES: u32 = 24;

/// Member items read per page of a key's walk.
const WALK_PAGE: usize = 50;

/// This backend's concurrency limit, below the crate's.
pub(super) fn check_concurrency(key: Option<&ConcurrencyKey>) -> Result<(), InvalidInput> {
    match key {
        Some(key) if key.limit() > MAX_CONCURRENCY => Err(InvalidInput::OutOfRange {
            field: "concurrency_limit",
            value: key.limit().to_string(),
            min: "1".into(),
            max: MAX_CONCURRENCY.to_string(),
        }),
        _ => Ok(()),
    }
}

/// A concurrency key as a claim read it.
struct KeyRead {
    name: String,
    /// The key item's `version` (0: none yet).
    version: u64,
    /// The holders whose lease is live at the claim's instant.
    live: Vec<(TaskId, u64)>,
    /// Where the key's unfinished tasks start, as read or as the walk found.
    first_from: u64,
    /// Whether the walk moved `first_from`.
    walked: bool,
    load: KeyLoad,
}

/// What a claim decides its limits on, read before its transaction.
pub(super) struct LimitState {
    key: Option<KeyRead>,
    bucket: Option<BucketState>,
}

impl LimitState {
    /// [`rules::within_limits`] of `task` at `now` on this state.
    pub(super) fn decide(
        &self,
        task: &Task,
        now: OffsetDateTime,
    ) -> Result<Option<OffsetDateTime>, crate::throttle::Throttled> {
        let load = self.key.as_ref().map(|k| k.load.clone()).unwrap_or_default();
        rules::within_limits(task, &load, self.bucket.as_ref(), now)
    }

    /// The items a claim granted at `version` writes with its task: the key
    /// item (holders: the live ones and this claim; `version` raised) and
    /// the bucket's new `schedule`, each on the condition that it is as read.
    pub(super) fn writes(
        &self,
        table: &str,
        id: TaskId,
        version: u64,
        schedule: Option<OffsetDateTime>,
    ) -> Vec<TransactWriteItem> {
        let mut items = Vec::new();
        if let Some(key) = &self.key {
            let mut holders: HashMap<String, AttributeValue> = key
                .live
                .iter()
                .filter(|(holder, _)| *holder != id)
                .map(|(holder, v)| (holder.to_string(), n(v)))
                .collect();
            holders.insert(id.to_string(), n(version));
            let mut e = Expr::default()
                .set(item::VERSION, n(key.version + 1))
                .set(item::HOLDERS, AttributeValue::M(holders));
            if key.walked {
                e = e.set(item::FIRST_FROM, n(key.first_from));
            }
            e = if key.version == 0 {
                e.cond("attribute_not_exists(#version)", &[item::VERSION], Vec::new())
            } else {
                e.cond(
                    "#version = :c_key_version",
                    &[item::VERSION],
                    vec![(":c_key_version", n(key.version))],
                )
            };
            items.push(e.update(table, item::key_of(item::conc_pk(&key.name), item::CONC_SK)));
        }
        if let (Some(state), Some(schedule)) = (&self.bucket, schedule) {
            let e = unchanged_schedule(Expr::default().set(item::SCHEDULE, at(schedule)), state.schedule);
            items.push(e.update(table, item::bucket_key(state.bucket.name())));
        }
        items
    }
}

/// The bucket item exists and its schedule is still `schedule`.
fn unchanged_schedule(e: Expr, schedule: Option<OffsetDateTime>) -> Expr {
    match schedule {
        None => e.cond(
            "attribute_exists(#pk) AND attribute_not_exists(#schedule)",
            &[PARTITION_KEY, item::SCHEDULE],
            Vec::new(),
        ),
        Some(old) => e.cond(
            "#schedule = :c_schedule",
            &[item::SCHEDULE],
            vec![(":c_schedule", at(old))],
        ),
    }
}

impl DynamoStore {
    /// Reads what a claim of `task` at `now` decides its limits on: its
    /// key item and bucket item in one snapshot (`TransactGetItems`), the
    /// key's holders' task items, and a limit-1 key's first unfinished task.
    pub(super) async fn limit_state(&self, task: &Task, now: OffsetDateTime) -> Result<LimitState> {
        let mut keys = Vec::new();
        if let Some(key) = &task.limits.concurrency {
            keys.push(item::key_of(item::conc_pk(key.name()), item::CONC_SK));
        }
        if let Some(bucket) = &task.limits.bucket {
            keys.push(item::bucket_key(bucket));
        }
        let mut read = self.transact_get("claim limits", &keys).await?.into_iter();
        let key = match &task.limits.concurrency {
            Some(key) => {
                let found = read.next().flatten();
                Some(self.key_read(key, found.as_ref(), now).await?)
            }
            None => None,
        };
        let bucket = match &task.limits.bucket {
            Some(_) => read
                .next()
                .flatten()
                .map(|found| item::bucket(&found))
                .transpose()
                .map_err(Error::storage)?,
            None => None,
        };
        Ok(LimitState { key, bucket })
    }

    async fn key_read(
        &self,
        key: &ConcurrencyKey,
        found: Option<&Item>,
        now: OffsetDateTime,
    ) -> Result<KeyRead> {
        let item::KeyItem {
            version,
            holders,
            first_from,
            ..
        } = match found {
            Some(found) => item::key_item(found).map_err(Error::storage)?,
            None => item::KeyItem::default(),
        };
        let live = self.live_holders(holders, now).await?;
        let mut read = KeyRead {
            name: key.name().to_owned(),
            version,
            live,
            first_from,
            walked: false,
            load: KeyLoad::default(),
        };
        read.load.running = u32::try_from(read.live.len()).unwrap_or(u32::MAX);
        if key.in_order() {
            let (first, from) = self.first_unfinished(key.name(), first_from).await?;
            read.load.first_unfinished = first;
            read.walked = from != first_from;
            read.first_from = from;
        }
        Ok(read)
    }

    /// The `holders` whose task holds a slot at `now` (running, lease
    /// unexpired: [`rules::holds_slot`]), read consistently.
    async fn live_holders(
        &self,
        holders: Vec<(TaskId, u64)>,
        now: OffsetDateTime,
    ) -> Result<Vec<(TaskId, u64)>> {
        if holders.is_empty() {
            return Ok(holders);
        }
        let ids: Vec<TaskId> = holders.iter().map(|(id, _)| *id).collect();
        let found = self
            .batch_get_as(&ids, Some(&Projection::of(&item::SLOT_ATTRIBUTES)))
            .await?;
        let mut live = Vec::new();
        for (id, version) in holders {
            let Some(found) = found.get(&id) else { continue }; // purged
            let (_, status, lease_until) = item::slot(found).map_err(Error::storage)?;
            if status == Status::Running && lease_until.is_some_and(|until| until > now) {
                live.push((id, version));
            }
        }
        Ok(live)
    }

    /// The first unfinished task of `key` by submission order, walking its
    /// member items from `from` on, and the order the key's unfinished
    /// tasks now start from (every member below it is finished or purged).
    async fn first_unfinished(&self, key: &str, from: u64) -> Result<(Option<TaskId>, u64)> {
        let mut next_from = from;
        let mut start = None;
        loop {
            let (page, more) = self.member_page(key, from, start).await?;
            for (order, id, status) in page {
                if status.is_some_and(|status| !status.is_terminal()) {
                    return Ok((Some(id), order));
                }
                next_from = order + 1;
            }
            match more {
                Some(more) => start = Some(more),
                None => return Ok((None, next_from)),
            }
        }
    }

    /// One page of `key`'s member items from order `from` on, each with
    /// its task's status (`None`: purged), and where the next page starts.
    async fn member_page(
        &self,
        key: &str,
        from: u64,
        start: Option<Item>,
    ) -> Result<(Vec<(u64, TaskId, Option<Status>)>, Option<Item>)> {
        let page = self
            .client
            .query()
            .table_name(&*self.table)
            .key_condition_expression("#pk = :pk AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#pk", PARTITION_KEY)
            .expression_attribute_names("#sk", SORT_KEY)
            .expression_attribute_values(":pk", s(item::conc_pk(key)))
            .expression_attribute_values(":from", s(item::member_sk(from)))
            .expression_attribute_values(":to", s(item::member_sk(u64::MAX)))
            .consistent_read(true)
            .limit(i32::try_from(WALK_PAGE).unwrap_or(i32::MAX))
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(sdk)?;
        let members = page
            .items()
            .iter()
            .map(item::member)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::storage)?;
        let ids: Vec<TaskId> = members.iter().map(|(_, id)| *id).collect();
        let found = self
            .batch_get_as(&ids, Some(&Projection::of(&item::SLOT_ATTRIBUTES)))
            .await?;
        let mut out = Vec::with_capacity(members.len());
        for (order, id) in members {
            let status = match found.get(&id) {
                Some(found) => Some(item::slot(found).map_err(Error::storage)?.1),
                None => None,
            };
            out.push((order, id, status));
        }
        Ok((out, page.last_evaluated_key().cloned()))
    }

    /// A submission's place in `key`'s order, as read now: the order, and
    /// the items its transaction writes for it (the key item's
    /// `next_order`, on the condition it is still as read; the member item).
    pub(super) async fn member_items(&self, key: &str, id: TaskId) -> Result<(u64, Vec<TransactWriteItem>)> {
        let key_item = item::key_of(item::conc_pk(key), item::CONC_SK);
        let found = self
            .transact_get("submit key", std::slice::from_ref(&key_item))
            .await?;
        let last = match found.into_iter().next().flatten() {
            Some(found) => item::key_item(&found).map_err(Error::storage)?.next_order,
            None => 0,
        };
        let order = last + 1;
        let e = Expr::default().set(item::NEXT_ORDER, n(order));
        let e = if last == 0 {
            e.cond(
                "attribute_not_exists(#next_order)",
                &[item::NEXT_ORDER],
                Vec::new(),
            )
        } else {
            e.cond(
                "#next_order = :c_order",
                &[item::NEXT_ORDER],
                vec![(":c_order", n(last))],
            )
        };
        let mut member = item::key_of(item::conc_pk(key), &item::member_sk(order));
        member.insert(item::TASK_ID.into(), s(id.to_string()));
        member.insert(item::KEY_ORDER.into(), n(order));
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(member))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", PARTITION_KEY)
            .build()
            .expect("table and item are set");
        Ok((
            order,
            vec![
                e.update(&self.table, key_item),
                TransactWriteItem::builder().put(put).build(),
            ],
        ))
    }

    /// The bucket named `name`, read consistently (`None`: not defined).
    pub(super) async fn read_bucket(&self, name: &str) -> Result<Option<BucketState>> {
        let out = self
            .client
            .get_item()
            .table_name(&*self.table)
            .set_key(Some(item::bucket_key(name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        out.item().map(item::bucket).transpose().map_err(Error::storage)
    }

    /// Defines `bucket`, or changes its rate and burst, keeping its schedule.
    pub(super) async fn put_bucket(&self, bucket: &RateBucket) -> Result<()> {
        let e = Expr::default()
            .set(item::NAME, s(bucket.name()))
            .set(item::RATE, n(bucket.rate()))
            .set(item::PERIOD, item::nanos(bucket.period()))
            .set(item::BURST, n(bucket.burst_size()));
        self.client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(item::bucket_key(bucket.name())))
            .update_expression(e.update_expression())
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    /// Drains the bucket named `name` until `retry_after` from now
    /// ([`rules::drain`]), on the condition that its schedule is as read.
    pub(super) async fn drain(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        for tries in 0..LIMIT_RACES {
            if tries > 0 {
                tokio::time::sleep(pause(tries)).await;
            }
            let Some(mut state) = self.read_bucket(name).await? else {
                return Ok(None);
            };
            let now = self.now();
            let schedule = rules::drain(&state.bucket, state.schedule, now + retry_after);
            let e = unchanged_schedule(Expr::default().set(item::SCHEDULE, at(schedule)), state.schedule);
            let items = vec![e.update(&self.table, item::bucket_key(name))];
            match self.transact("drain_bucket", items, Layout::OWN).await? {
                Tx::Written => {
                    state.schedule = Some(schedule);
                    return Ok(Some(state));
                }
                Tx::Refused(_) => {} // a claim took a token meanwhile: read again
                Tx::KeyTaken(_) | Tx::RecordChanged => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced("drain_bucket")))
    }

    /// Every bucket, by name: one consistent query of the buckets' partition.
    pub(super) async fn all_buckets(&self) -> Result<Vec<BucketState>> {
        let items = self
            .query_all(
                None,
                "#pk = :pk",
                HashMap::from([("#pk".to_owned(), PARTITION_KEY.to_owned())]),
                HashMap::from([(":pk".to_owned(), s(item::BUCKETS_PK))]),
                None,
            )
            .await?;
        items
            .iter()
            .map(|found| item::bucket(found).map_err(Error::storage))
            .collect()
    }

    /// Who holds the slots of `key` now (its key item's live holders, by
    /// task id), and how many of its tasks are pending (its member items
    /// from `first_from` on).
    pub(super) async fn key_slots(&self, key: &str) -> Result<KeySlots> {
        let now = self.now();
        let key_item = item::key_of(item::conc_pk(key), item::CONC_SK);
        let found = self
            .transact_get("concurrency", std::slice::from_ref(&key_item))
            .await?;
        let read = match found.into_iter().next().flatten() {
            Some(found) => item::key_item(&found).map_err(Error::storage)?,
            None => item::KeyItem::default(),
        };
        let holders = read.holders;
        let mut running: Vec<TaskId> = self
            .live_holders(holders, now)
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        running.sort_unstable();
        let mut waiting = 0;
        let mut start = None;
        loop {
            // Below `first_from` every task is finished: none waits there.
            let (page, more) = self.member_page(key, read.first_from, start).await?;
            waiting += page
                .iter()
                .filter(|(_, _, status)| *status == Some(Status::Pending))
                .count() as u64;
            match more {
                Some(more) => start = Some(more),
                None => break,
            }
        }
        Ok(KeySlots {
            key: key.to_owned(),
            running,
            waiting,
        })
    }
}
