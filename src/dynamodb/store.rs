//! [`DynamoStore`] and its operations: every fenced write one conditional
//! request (`UpdateItem` or `TransactWriteItems`) whose condition carries the
//! guard, a refused write classified from its `ALL_OLD` image by the same
//! [`rules`] functions every backend uses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::backend::rules::{self, CancelRule, ClaimRule, Work};
use crate::backend::{Backend, entry, new_lease, new_task, renewed};
use crate::clock::{Clock, SystemClock};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, InvalidInput, Result};
use crate::limits;
use crate::policy::{AcceptanceRule, Failure};
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};
use crate::throttle::{BucketState, RateBucket};

use super::expr::{Expr, attempt_update, claimable, fence, finish_if_running, terminal, unchanged};
use super::item::{self, Item, at, b, n, s};
use super::limits::{LIMIT_RACES, check_concurrency};
use super::table::{DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY, TTL, UNCLAIMED_AT, UNCLAIMED_SHARD};
use super::tx::{CONFLICT_RETRIES, Layout, RACE_RETRIES, Raced, Tx, pause, sdk};
use super::with::WithItems;
use super::{MAX_EXTRA_ITEMS, MAX_PAYLOAD_LEN, MAX_RESPONSE_LEN};

/// How many index entries a `claim_next` reads per lease it may hand out:
/// room for tasks other callers take first and for the ones its operations
/// and scopes leave out.
const CANDIDATES_PER_CLAIM: usize = 4;

/// The DynamoDB [`TaskStore`](crate::TaskStore): one table, conditional writes, leases on the
/// writer's clock (see the [module documentation](crate::dynamodb)).
///
/// Cheap to clone. The application builds the `Client` (credentials, region,
/// endpoint, HTTP client); the store reads none of them itself.
///
/// ```no_run
/// # async fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::{Claim, ClaimRequest, DynamoStore, InputHash, NewTask, RequestKey, Response, TaskStore};
///
/// let store = DynamoStore::new(client, "taskfence")?;
/// let key = RequestKey::new("user-1", "chat.reply", "req-1");
/// let task = store.submit(NewTask::new(key, InputHash::of(["msg-1"]))).await?.into_task();
/// if let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("worker-a", Duration::from_secs(30))).await? {
///     assert!(store.complete(lease, Response::from("hello")).await?.is_accepted());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoStore {
    pub(super) client: Client,
    pub(super) table: Arc<str>,
    clock: Arc<dyn Clock>,
    /// Whether submissions write handoffs (see [`DynamoStoreBuilder::without_handoffs`]).
    handoffs: bool,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("clock", &self.clock)
            .field("handoffs", &self.handoffs)
            .finish_non_exhaustive()
    }
}

/// Configures a [`DynamoStore`]: the clock leases are measured on.
///
/// ```no_run
/// # fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
/// let clock = taskfence::clock::ManualClock::default();
/// let store = taskfence::DynamoStore::builder(client, "taskfence").clock(clock).build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "call build() to get the store"]
pub struct DynamoStoreBuilder {
    client: Client,
    table: String,
    clock: Arc<dyn Clock>,
    handoffs: bool,
}

impl DynamoStoreBuilder {
    /// The clock this store's writes compare leases with (default [`SystemClock`]).
    ///
    /// ```no_run
    /// # fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
    /// let store = taskfence::DynamoStore::builder(client, "taskfence").clock(taskfence::clock::SystemClock).build()?;
    /// # Ok(()) }
    /// ```
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// No submission through this store writes a handoff item, whatever the
    /// [`NewTask`](crate::NewTask) says: for an application that runs no
    /// dispatcher ([`dispatch`](crate::dispatch::Outbox::dispatch)), so no
    /// item accumulates unpublished until the purge and each submission is
    /// a transaction of two items, not three. By default every submission
    /// writes one (the transactional outbox, as on PostgreSQL) unless the
    /// task was submitted [`without_handoff`](crate::NewTask::without_handoff);
    /// a reopening writes one when its task had one. `PgStore` has the same
    /// switch.
    ///
    /// ```no_run
    /// # fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
    /// let store = taskfence::DynamoStore::builder(client, "taskfence").without_handoffs().build()?;
    /// # Ok(()) }
    /// ```
    pub fn without_handoffs(mut self) -> Self {
        self.handoffs = false;
        self
    }

    /// Builds the store; a table name DynamoDB would refuse (3–255 of
    /// `a-z A-Z 0-9 _ - .`) is [`InvalidInput`].
    ///
    /// ```no_run
    /// # fn f(client: aws_sdk_dynamodb::Client) {
    /// assert!(taskfence::DynamoStore::builder(client, "no spaces").build().is_err());
    /// # }
    /// ```
    pub fn build(self) -> Result<DynamoStore> {
        let valid = (3..=255).contains(&self.table.len())
            && self
                .table
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
        if !valid {
            return Err(InvalidInput::Inconsistent(
                "a DynamoDB table name is 3-255 characters of a-z, A-Z, 0-9, '_', '-' and '.'",
            )
            .into());
        }
        Ok(DynamoStore {
            client: self.client,
            table: self.table.into(),
            clock: self.clock,
            handoffs: self.handoffs,
        })
    }
}

impl DynamoStore {
    /// A store on `table` (created with [`create_table`](super::create_table)
    /// or the definition in `docs/DYNAMODB.md`), on the system clock.
    ///
    /// ```no_run
    /// # fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
    /// let store = taskfence::DynamoStore::new(client, "taskfence")?;
    /// # Ok(()) }
    /// ```
    pub fn new(client: Client, table: impl Into<String>) -> Result<Self> {
        Self::builder(client, table).build()
    }

    /// A builder, to choose the clock.
    ///
    /// ```no_run
    /// # fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
    /// let store = taskfence::DynamoStore::builder(client, "taskfence").clock(taskfence::clock::SystemClock).build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: Client, table: impl Into<String>) -> DynamoStoreBuilder {
        DynamoStoreBuilder {
            client,
            table: table.into(),
            clock: Arc::new(SystemClock),
            handoffs: true,
        }
    }

    /// The table's name.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::DynamoStore) {
    /// println!("{}", store.table());
    /// # }
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The client the store sends its requests with.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::DynamoStore) {
    /// let client: &aws_sdk_dynamodb::Client = store.client();
    /// # }
    /// ```
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// This store with the application's own items for its next write, in
    /// the same `TransactWriteItems` (the user's message with its task, the
    /// reply with its completion): all of them are written, or none. A
    /// [`TaskStore`](crate::TaskStore) as far as one transaction allows —
    /// [`WithItems`] says which operations carry the items and which are
    /// refused. DynamoDB's counterpart of `PgStore::on` (the store in the
    /// caller's PostgreSQL transaction).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore, new: taskfence::NewTask) -> taskfence::Result<()> {
    /// use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    /// let message = Put::builder()
    ///     .table_name("messages")
    ///     .item("id", AttributeValue::S("msg-42".into()))
    ///     .item("body", AttributeValue::S("What are the key decisions?".into()))
    ///     .build()
    ///     .expect("table and item are set");
    /// use taskfence::TaskStore;
    /// let items = vec![TransactWriteItem::builder().put(message).build()];
    /// let task = store.with(items).submit(new).await?.into_task();
    /// # Ok(()) }
    /// ```
    pub fn with(&self, items: Vec<TransactWriteItem>) -> WithItems<'_> {
        WithItems::new(self, items)
    }

    pub(super) fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }

    pub(super) async fn submit_items(
        &self,
        new: NewTask,
        extra: Vec<TransactWriteItem>,
    ) -> Result<Submitted> {
        check_concurrency(new.limits.concurrency.as_ref())?;
        if let Some(bucket) = &new.limits.bucket
            && self.read_bucket(bucket).await?.is_none()
        {
            // Buckets are never removed: defined now, defined at the write.
            return Err(InvalidInput::UnknownBucket {
                bucket: bucket.clone(),
            }
            .into());
        }
        let now = self.now();
        let expires_at = now + new.retention;
        let handoff = new.handoff && self.handoffs;
        let task = new_task(TaskId::new(), new, now, expires_at);
        let (key_item, task_item) = item::new_items(&task);
        let put = |item: Item| {
            let put = Put::builder()
                .table_name(&*self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PARTITION_KEY)
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .build()
                .expect("table and item are set");
            TransactWriteItem::builder().put(put).build()
        };
        let mut tries = 0;
        let mut changed = 0;
        while tries < RACE_RETRIES {
            let mut task_item = task_item.clone();
            if !handoff {
                item::set_without_handoff(&mut task_item);
            }
            // A keyed task takes the next place in its key's submission order.
            let member = match &task.limits.concurrency {
                Some(key) => {
                    let (order, items) = self.member_items(key.name(), task.id).await?;
                    task_item.insert(item::KEY_ORDER.into(), n(order));
                    items
                }
                None => Vec::new(),
            };
            let mut items = vec![put(key_item.clone()), put(task_item)];
            let records = (items.len(), items.len() + member.len());
            items.extend(member);
            if handoff {
                // The outbox: published by `dispatch` (see `dispatch.rs`).
                items.push(self.handoff_put(task.id, now));
            }
            let own = items.len();
            items.extend(extra.iter().cloned());
            let layout = Layout::extra_from(own).records(records.0, records.1);
            match self.transact("submit", items, layout).await? {
                Tx::Written => {
                    tracing::Span::current().record("task_id", tracing::field::display(task.id));
                    return Ok(Submitted::Created(task));
                }
                Tx::Refused(None) => tries += 1, // the record went away: try again
                Tx::Refused(Some(old)) => {
                    let (existing, hash) = item::dedup(&old).map_err(Error::storage)?;
                    if hash != task.input_hash {
                        return Err(Error::KeyConflict { existing });
                    }
                    match self.read_task(existing).await? {
                        Some(found) => return Ok(Submitted::Existing(found)),
                        None => tries += 1, // purged between the two requests
                    }
                }
                // Another submission took the key's next place: read it again.
                Tx::RecordChanged if changed < LIMIT_RACES => {
                    changed += 1;
                    tokio::time::sleep(pause(changed)).await;
                }
                Tx::RecordChanged => break,
                Tx::KeyTaken(_) => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced("submit")))
    }

    async fn claim_task(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let Some(task) = self.read_task(id).await? else {
            return Ok(Claim::NotFound);
        };
        self.claim_read(id, task, request).await
    }

    /// Decides a claim on `task` as read, and writes the decision in one
    /// conditional transaction; a refusal decides again on its image.
    async fn claim_read(&self, id: TaskId, mut task: Task, request: ClaimRequest) -> Result<Claim> {
        let attempt_id = AttemptId::new();
        let pk = item::task_pk(id);
        let (mut races, mut changed) = (0, 0);
        while races < RACE_RETRIES {
            let now = self.now();
            let mut items = Vec::new();
            let mut next = task.clone();
            let decided = match rules::claim(&task, now) {
                ClaimRule::Answer(answer) => return Ok(answer),
                ClaimRule::Exhaust(reason) => {
                    let e = claimable(unchanged(Expr::default(), &task), &task, now);
                    let e = terminal(
                        e,
                        &mut next,
                        Status::Failed,
                        now,
                        Some(reason.as_str().to_owned()),
                    );
                    items.push(e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)));
                    items.push(self.dedup_ttl(&task));
                    None
                }
                ClaimRule::Take => {
                    // Within its limits, decided on its key and bucket items
                    // as read; the claim's transaction writes them back on
                    // the condition that they are still as read.
                    let limits = if task.limits.is_none() {
                        Vec::new()
                    } else {
                        let state = self.limit_state(&task, now).await?;
                        match state.decide(&task, now) {
                            Ok(schedule) => state.writes(&self.table, id, task.version + 1, schedule),
                            Err(why) => return Ok(Claim::Throttled(why)),
                        }
                    };
                    let until = now + request.lease_duration;
                    next.version += 1;
                    next.status = Status::Running;
                    next.lease_until = Some(until);
                    next.not_before = None;
                    let e = claimable(unchanged(Expr::default(), &task), &task, now)
                        .set(item::VERSION, n(next.version))
                        .set(item::STATUS, s(Status::Running.as_str()))
                        .set(item::LEASE_UNTIL, at(until))
                        .set(DUE_SHARD, s(DUE_INDEX))
                        .set(DUE_AT, at(until))
                        .remove(item::NOT_BEFORE)
                        .remove(UNCLAIMED_SHARD)
                        .remove(UNCLAIMED_AT);
                    items.push(e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)));
                    let attempt = Attempt {
                        id: attempt_id,
                        task_id: id,
                        number: next.attempts(),
                        worker: request.worker.clone(),
                        started_at: now,
                        finished_at: None,
                        outcome: AttemptOutcome::Running,
                        operation_id: None,
                        error: None,
                    };
                    // A new version's attempt: an item already there would be
                    // another claim's, never to be overwritten.
                    let put = Put::builder()
                        .table_name(&*self.table)
                        .set_item(Some(item::attempt_item(&attempt)))
                        .condition_expression("attribute_not_exists(#pk)")
                        .expression_attribute_names("#pk", PARTITION_KEY)
                        .build()
                        .expect("table and item are set");
                    items.push(TransactWriteItem::builder().put(put).build());
                    items.extend(limits);
                    Some(until)
                }
            };
            let records = (2, items.len());
            if task.status == Status::Running {
                // The previous assignment, taken over or out of budget, ends as
                // expired. (A pending task's last attempt has ended already.)
                let key = item::key_of(pk.clone(), &item::attempt_sk(task.version));
                items.push(finish_if_running(AttemptOutcome::Expired, now).update(&self.table, key));
            }
            match self
                .transact("claim", items, Layout::OWN.records(records.0, records.1))
                .await?
            {
                Tx::Written => {
                    return Ok(match decided {
                        Some(until) => {
                            let span = tracing::Span::current();
                            span.record("version", next.version);
                            span.record("attempt_id", tracing::field::display(attempt_id));
                            Claim::Acquired(new_lease(next, attempt_id, request.worker, until))
                        }
                        None => Claim::Failed(next),
                    });
                }
                Tx::Refused(None) => return Ok(Claim::NotFound),
                // Decide again on the item as it is now: no extra read.
                Tx::Refused(Some(old)) => {
                    task = item::task(&old).map_err(Error::storage)?;
                    races += 1;
                }
                // Another claim of the key (or the bucket) committed first:
                // read the limits again and decide again.
                Tx::RecordChanged if changed < LIMIT_RACES => {
                    changed += 1;
                    tokio::time::sleep(pause(changed)).await;
                }
                Tx::RecordChanged => break,
                Tx::KeyTaken(_) => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced("claim")))
    }

    pub(super) async fn complete_items(
        &self,
        lease: Lease,
        response: Response,
        extra: Vec<TransactWriteItem>,
    ) -> Result<Fenced<Task>> {
        let id = lease.task_id();
        let version = lease.version();
        let pk = item::task_pk(id);
        // The state the completion is first tried on: the lease's own, still
        // running. Under `FirstValidAnswer` a refusal may show another state
        // that the rule accepts; the next try is decided on that image.
        let mut expected = lease.task().clone();
        expected.status = Status::Running;
        expected.version = version;
        let extra_from = 3;
        for _ in 0..RACE_RETRIES {
            let now = self.now();
            let mut done = expected.clone();
            let mut e = unchanged(Expr::default(), &expected);
            if expected.acceptance == AcceptanceRule::CurrentAssignment {
                e = fence(e, version, now);
            }
            done.response = Some(response.clone());
            let e = terminal(
                e.set(item::RESPONSE, b(response.as_bytes().to_vec())),
                &mut done,
                Status::Completed,
                now,
                None,
            );
            let mut items = vec![
                e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                attempt_update(Expr::default())
                    .set(item::FINISHED_AT, at(now))
                    .set(item::OUTCOME, s(AttemptOutcome::Completed.as_str()))
                    .update(&self.table, item::key_of(pk.clone(), &item::attempt_sk(version))),
                self.dedup_ttl(&expected),
            ];
            // The application's items sit at fixed positions (after the three
            // above); the overtaken attempt, when there is one, comes last.
            items.extend(extra.iter().cloned());
            if expected.version != version {
                // An earlier attempt's answer is saved: the current one is overtaken.
                let key = item::key_of(pk.clone(), &item::attempt_sk(expected.version));
                items.push(finish_if_running(AttemptOutcome::Overtaken, now).update(&self.table, key));
            }
            match self
                .transact("complete", items, Layout::extra_from(extra_from))
                .await?
            {
                Tx::Written => return Ok(Fenced::Accepted(done)),
                Tx::Refused(None) => return Err(Error::NotFound(id)),
                Tx::Refused(Some(old)) => {
                    let old = item::task(&old).map_err(Error::storage)?;
                    if let Err(rejection) = rules::accept(&old, version, now) {
                        tracing::debug!(%rejection, "completion rejected");
                        return Ok(Fenced::Rejected(rejection));
                    }
                    expected = old;
                }
                Tx::KeyTaken(_) | Tx::RecordChanged => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced("complete")))
    }

    /// The lease's fence as a `ConditionCheck` on the task item, at this
    /// store's clock now: for an application that sends its own
    /// `TransactWriteItems` and wants its items written only under a
    /// current lease. A cancellation whose reason for this item is
    /// `ConditionalCheckFailed` means the lease is no longer current (read
    /// the task to know why); [`with(items).write(&lease)`](WithItems::write)
    /// sends such a transaction and answers with the reason.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore, lease: taskfence::Lease, mut items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>) -> Result<(), Box<dyn std::error::Error>> {
    /// items.push(store.fence_item(&lease));
    /// store.client().transact_write_items().set_transact_items(Some(items)).send().await?;
    /// # Ok(()) }
    /// ```
    pub fn fence_item(&self, lease: &Lease) -> TransactWriteItem {
        fence(Expr::default(), lease.version(), self.now()).check(
            &self.table,
            item::key_of(item::task_pk(lease.task_id()), item::TASK_SK),
        )
    }

    /// [`WithItems::write`]: the application's items after the fence check.
    pub(super) async fn fenced_items(
        &self,
        lease: &Lease,
        extra: Vec<TransactWriteItem>,
    ) -> Result<Fenced<()>> {
        let key = item::key_of(item::task_pk(lease.task_id()), item::TASK_SK);
        self.fenced_tx("fence", rules::fence, lease, Layout::extra_from(1), |now| {
            let mut items =
                vec![fence(Expr::default(), lease.version(), now).check(&self.table, key.clone())];
            items.extend(extra.iter().cloned());
            (items, ())
        })
        .await
    }

    /// [`TaskStore::fail`](crate::TaskStore::fail), with the application's
    /// `extra` items in the same transaction.
    pub(super) async fn fail_items(
        &self,
        lease: Lease,
        failure: Failure,
        extra: &[TransactWriteItem],
    ) -> Result<Fenced<Retry>> {
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx_with("fail", rules::fence, &lease, Layout::OWN, extra, |now| {
            // The fence pins the item to the lease's own state, so the
            // decision is made on the lease's snapshot.
            let mut task = lease.task().clone();
            task.status = Status::Running;
            let mut e = fence(Expr::default(), lease.version(), now);
            let mut items = Vec::new();
            let retry = match rules::after_failure(&task, lease.attempt_id(), &failure, now) {
                Ok(not_before) => {
                    e = e
                        .set(item::STATUS, s(Status::Pending.as_str()))
                        .set(item::NOT_BEFORE, at(not_before))
                        .set(item::LAST_ERROR, s(&failure.message))
                        .set(DUE_SHARD, s(DUE_INDEX))
                        .set(DUE_AT, at(not_before))
                        .remove(item::LEASE_UNTIL);
                    Retry::Scheduled {
                        not_before,
                        attempts_left: task.attempts_left(),
                    }
                }
                Err(reason) => {
                    let message = reason.message(&failure.message);
                    e = terminal(e, &mut task, Status::Failed, now, Some(message));
                    items.push(self.dedup_ttl(&task));
                    Retry::Exhausted(Box::new(task.clone()))
                }
            };
            items.insert(0, e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)));
            items.push(
                attempt_update(Expr::default())
                    .set(item::FINISHED_AT, at(now))
                    .set(item::OUTCOME, s(AttemptOutcome::Failed(failure.kind).as_str()))
                    .set(item::ERROR, s(&failure.message))
                    .update(
                        &self.table,
                        item::key_of(pk.clone(), &item::attempt_sk(lease.version())),
                    ),
            );
            (items, retry)
        })
        .await
    }

    /// [`TaskStore::release`](crate::TaskStore::release) (or
    /// [`release_unstarted`](crate::TaskStore::release_unstarted), by
    /// `work`), with the application's `extra` items in the same
    /// transaction: the fence as the condition, [`rules::release`]'s change
    /// as the update (the refund as an addition to the budget base).
    pub(super) async fn release_items(
        &self,
        lease: Lease,
        work: Work,
        extra: &[TransactWriteItem],
    ) -> Result<Fenced<()>> {
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx_with("release", rules::fence, &lease, Layout::OWN, extra, |now| {
            // Due again from now on: in the due index, so `due` and
            // `claim_next` find it.
            let mut task = fence(Expr::default(), lease.version(), now)
                .set(item::STATUS, s(Status::Pending.as_str()))
                .remove(item::LEASE_UNTIL)
                .set(item::NOT_BEFORE, at(now))
                .set(DUE_SHARD, s(DUE_INDEX))
                .set(DUE_AT, at(now));
            if work.refund() > 0 {
                task = task.add_to(item::BUDGET_BASE, work.refund());
            }
            let attempt = attempt_update(Expr::default())
                .set(item::FINISHED_AT, at(now))
                .set(item::OUTCOME, s(work.outcome().as_str()));
            let items = vec![
                task.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                attempt.update(
                    &self.table,
                    item::key_of(pk.clone(), &item::attempt_sk(lease.version())),
                ),
            ];
            (items, ())
        })
        .await
    }

    /// [`TaskStore::record_operation`](crate::TaskStore::record_operation),
    /// with the application's `extra` items in the same transaction.
    pub(super) async fn record_operation_items(
        &self,
        lease: &Lease,
        operation_id: &str,
        extra: &[TransactWriteItem],
    ) -> Result<Fenced<()>> {
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx_with(
            "record_operation",
            rules::fence,
            lease,
            Layout::OWN,
            extra,
            |now| {
                let items = vec![
                    fence(Expr::default(), lease.version(), now)
                        .check(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                    attempt_update(Expr::default())
                        .set(item::OPERATION_ID, s(operation_id))
                        .update(
                            &self.table,
                            item::key_of(pk.clone(), &item::attempt_sk(lease.version())),
                        ),
                ];
                (items, ())
            },
        )
        .await
    }

    /// Sets the dedup record's TTL as its task turns terminal, so DynamoDB
    /// expires it even if nobody runs `purge_expired`; never while the task is live.
    fn dedup_ttl(&self, task: &Task) -> TransactWriteItem {
        Expr::default()
            .set(TTL, item::ttl_secs(task.expires_at))
            .cond(
                "#task_id = :c_task",
                &[item::TASK_ID],
                vec![(":c_task", s(task.id.to_string()))],
            )
            .update(&self.table, item::key_of(item::key_pk(&task.key), item::KEY_SK))
    }
}

/// This backend's payload limit, below the crate's (an item is at most 400 KB).
pub(super) fn check_payload(new: &NewTask) -> Result<(), InvalidInput> {
    limits::check_len("payload", new.payload.len(), MAX_PAYLOAD_LEN)
}

/// This backend's response limit, below the crate's.
pub(super) fn check_response(response: &Response) -> Result<(), InvalidInput> {
    limits::check_len("response", response.len(), MAX_RESPONSE_LEN)
}

/// At most [`MAX_EXTRA_ITEMS`] of the application's items in one transaction.
pub(super) fn check_extra(count: usize) -> Result<(), InvalidInput> {
    if count > MAX_EXTRA_ITEMS {
        return Err(InvalidInput::OutOfRange {
            field: "extra transaction items",
            value: count.to_string(),
            min: "0".into(),
            max: MAX_EXTRA_ITEMS.to_string(),
        });
    }
    Ok(())
}

#[async_trait]
impl Backend for DynamoStore {
    async fn submit(&self, new: NewTask) -> Result<Submitted> {
        check_payload(&new)?;
        self.submit_items(new, Vec::new()).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        self.read_task(id).await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        let out = self
            .client
            .get_item()
            .table_name(&*self.table)
            .set_key(Some(item::key_of(item::key_pk(key), item::KEY_SK)))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        let Some(record) = out.item() else { return Ok(None) };
        let (id, _) = item::dedup(record).map_err(Error::storage)?;
        self.read_task(id).await
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.claim_task(id, request).await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let (mut races, mut conflicts) = (0, 0);
        while races < RACE_RETRIES {
            let now = self.now();
            let until = now + extend_by;
            let e = fence(Expr::default(), lease.version(), now)
                .set(item::LEASE_UNTIL, at(until))
                .set(DUE_AT, at(until));
            let sent = self
                .client
                .update_item()
                .table_name(&*self.table)
                .set_key(Some(item::key_of(item::task_pk(lease.task_id()), item::TASK_SK)))
                .update_expression(e.update_expression())
                .set_condition_expression(e.condition())
                .set_expression_attribute_names(e.names())
                .set_expression_attribute_values(e.values())
                .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
                .send()
                .await;
            match sent {
                Ok(_) => {
                    renewed(lease, until);
                    return Ok(Fenced::Accepted(()));
                }
                Err(SdkError::ServiceError(service))
                    if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
                {
                    let UpdateItemError::ConditionalCheckFailedException(refused) = service.into_err() else {
                        unreachable!("matched above")
                    };
                    let Some(old) = refused.item() else {
                        return Err(Error::NotFound(lease.task_id()));
                    };
                    let old = item::task(old).map_err(Error::storage)?;
                    if let Err(rejection) = rules::fence(&old, lease.version(), now) {
                        tracing::debug!(%rejection, "fenced write rejected");
                        return Ok(Fenced::Rejected(rejection));
                    }
                    races += 1;
                }
                // A transaction (a claim, a completion) holds the item for a moment.
                Err(SdkError::ServiceError(service))
                    if matches!(service.err(), UpdateItemError::TransactionConflictException(_))
                        && conflicts < CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                    tokio::time::sleep(pause(conflicts)).await;
                }
                Err(err) => return Err(sdk(err)),
            }
        }
        Err(Error::storage(Raced("renew")))
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        check_response(&response)?;
        self.complete_items(lease, response, Vec::new()).await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        self.fail_items(lease, failure, &[]).await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        self.release_items(lease, Work::Started, &[]).await
    }

    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        self.release_items(lease, Work::NotStarted, &[]).await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let mut task = self.read_task(id).await?.ok_or(Error::NotFound(id))?;
        let pk = item::task_pk(id);
        for _ in 0..RACE_RETRIES {
            if let CancelRule::Answer(answer) = rules::cancel(&task) {
                return Ok(answer);
            }
            let now = self.now();
            let mut next = task.clone();
            let e = terminal(
                unchanged(Expr::default(), &task),
                &mut next,
                Status::Cancelled,
                now,
                Some(reason.to_owned()),
            );
            let mut items = vec![
                e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                self.dedup_ttl(&task),
            ];
            if task.status == Status::Running {
                // A pending task's last attempt has ended already: nothing to write.
                let key = item::key_of(pk.clone(), &item::attempt_sk(task.version));
                items.push(finish_if_running(AttemptOutcome::Cancelled, now).update(&self.table, key));
            }
            match self.transact("cancel", items, Layout::OWN).await? {
                Tx::Written => return Ok(Fenced::Accepted(next)),
                Tx::Refused(None) => return Err(Error::NotFound(id)),
                Tx::Refused(Some(old)) => task = item::task(&old).map_err(Error::storage)?,
                Tx::KeyTaken(_) | Tx::RecordChanged => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced("cancel")))
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        self.record_operation_items(lease, operation_id, &[]).await
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        self.reopen_task(id, request).await
    }

    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        self.begin_effect_step(lease, name).await
    }

    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        self.finish_effect_step(lease, name, &outcome).await
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        self.effect_records(id).await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        self.prefixed_items(id, item::ATTEMPT_PREFIX)
            .await?
            .iter()
            .map(|i| item::attempt(i, id).map_err(Error::storage))
            .collect()
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        self.due_ids(self.now(), limit).await
    }

    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let mut items = self.batch_get(ids).await?;
        let mut read: Vec<Option<Task>> = Vec::with_capacity(ids.len());
        for id in ids {
            read.push(match items.remove(id) {
                Some(found) => Some(item::task(&found).map_err(Error::storage)?),
                None => None,
            });
        }
        let claims = Self::concurrently(ids.len(), |i| {
            let (store, id, task, request) = (self.clone(), ids[i], read[i].take(), request.clone());
            let span = entry::span("claim", Some(id));
            async move {
                match task {
                    None => Ok(Claim::NotFound),
                    Some(task) => store.claim_read(id, task, request).await,
                }
            }
            .instrument(span)
        })
        .await?;
        self.all_or_released(claims).await
    }

    /// Each completion is its own conditional transaction (no read, as
    /// [`complete`](crate::TaskStore::complete)), the transactions concurrent.
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        completions
            .iter()
            .try_for_each(|(_, response)| check_response(response))?;
        let mut completions: Vec<Option<(Lease, Response)>> = completions.into_iter().map(Some).collect();
        let saved = Self::concurrently(completions.len(), |i| {
            let store = self.clone();
            let (lease, response) = completions[i].take().expect("each completion is taken once");
            let span = entry::lease_span("complete", &lease);
            async move { store.complete_items(lease, response, Vec::new()).await }.instrument(span)
        })
        .await?;
        let mut out = Vec::with_capacity(saved.len());
        for result in saved {
            match result {
                Err(Error::NotFound(id)) => out.push(Err(Error::NotFound(id))),
                Err(e) => return Err(e),
                Ok(fenced) => out.push(Ok(fenced)),
            }
        }
        Ok(out)
    }

    /// Each renewal is its own conditional update (as
    /// [`renew`](crate::TaskStore::renew)), the updates concurrent: a
    /// consumer renews every lease it holds in one call, and one at a time
    /// that call would take the sum of their latencies, which under load
    /// outlasts the period it must fit in.
    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let renewed = Self::concurrently(leases.len(), |i| {
            let (store, mut lease) = (self.clone(), leases[i].clone());
            let span = entry::lease_span("renew", &lease);
            async move {
                let answer = Backend::renew(&store, &mut lease, extend_by).await;
                answer.map(|fenced| (lease, fenced))
            }
            .instrument(span)
        })
        .await?;
        let mut out = Vec::with_capacity(renewed.len());
        for (slot, answer) in leases.iter_mut().zip(renewed) {
            let (lease, fenced) = answer?;
            *slot = lease;
            out.push(fenced);
        }
        Ok(out)
    }

    /// Candidates from both queue indexes (due since `now`, and never
    /// claimed), read again consistently, ordered by [`rules::due_since`];
    /// then claimed in that order, each by the conditional write of
    /// [`claim`](crate::TaskStore::claim), a round at a time until the limit
    /// is reached or the candidates run out: a task another caller took
    /// first answers busy and the next candidate takes its place.
    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        let now = self.now();
        let window = request.limit.saturating_mul(CANDIDATES_PER_CLAIM);
        let mut ids = self.due_ids(now, window).await?;
        ids.extend(self.unclaimed_ids(window).await?);
        ids.sort_unstable();
        ids.dedup();
        let mut found = self.batch_get(&ids).await?;
        let mut candidates = Vec::with_capacity(found.len());
        for id in ids {
            let Some(item) = found.remove(&id) else { continue };
            let task = item::task(&item).map_err(Error::storage)?;
            if let Some(since) = rules::due_since(&task, now).filter(|_| rules::wanted(&request, &task)) {
                candidates.push((since, id, task));
            }
        }
        // Round-robin by concurrency key; a candidate its limits refuse is
        // answered `Throttled` by its claim, writes nothing, and is skipped.
        let order = rules::fair_order(
            &candidates
                .iter()
                .map(|(since, _, task)| (task, *since))
                .collect::<Vec<_>>(),
        );
        let mut slots: Vec<Option<_>> = candidates.into_iter().map(Some).collect();
        let candidates: Vec<_> = order.into_iter().filter_map(|i| slots[i].take()).collect();
        let mut candidates = candidates.into_iter();
        let mut leases = Vec::with_capacity(request.limit);
        while leases.len() < request.limit {
            let round: Vec<(TaskId, Task)> = candidates
                .by_ref()
                .take(request.limit - leases.len())
                .map(|(_, id, task)| (id, task))
                .collect();
            if round.is_empty() {
                break;
            }
            // Tasks without limits are claimed side by side; tasks naming a
            // limit one after another, in the fair order, so a key's slot
            // or a bucket's token goes to the candidate offered first.
            let (limited, free): (Vec<_>, Vec<_>) =
                round.into_iter().partition(|(_, task)| !task.limits.is_none());
            let mut lanes: Vec<Option<Vec<(TaskId, Task)>>> =
                free.into_iter().map(|c| Some(vec![c])).collect();
            if !limited.is_empty() {
                lanes.push(Some(limited));
            }
            let claims = Self::concurrently(lanes.len(), |i| {
                let (store, claim) = (self.clone(), request.request());
                let lane = lanes[i].take().expect("each lane is claimed once");
                async move {
                    let mut out = Vec::with_capacity(lane.len());
                    for (id, task) in lane {
                        let answer = store
                            .claim_read(id, task, claim.clone())
                            .instrument(entry::span("claim", Some(id)))
                            .await;
                        let failed = answer.is_err();
                        out.push(answer);
                        if failed {
                            break;
                        }
                    }
                    out
                }
            })
            .await?;
            let claims = claims.into_iter().flatten();
            let mut failed = None;
            for claim in claims {
                match claim {
                    Ok(Claim::Acquired(lease)) => leases.push(lease),
                    Ok(_) => {}
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                self.release_all(leases).await;
                return Err(e);
            }
        }
        Ok(leases)
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.purge(limit).await
    }

    /// Concurrency keys and rate buckets are decided in the claim's own
    /// transaction (see `docs/LIMITS.md`, "On DynamoDB").
    fn decides_limits(&self) -> bool {
        true
    }

    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        self.put_bucket(&bucket).await
    }

    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        self.drain(name, retry_after).await
    }
}

impl DynamoStore {
    /// The claims when every one was answered; otherwise the first error,
    /// after giving back the leases the others took, so those tasks wait for
    /// no lease (the caller never saw them).
    async fn all_or_released(&self, claims: Vec<Result<Claim>>) -> Result<Vec<Claim>> {
        let Some(failed) = claims.iter().position(Result::is_err) else {
            return claims.into_iter().collect();
        };
        let mut error = None;
        let mut taken = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            match claim {
                Err(e) if i == failed => error = Some(e),
                Ok(Claim::Acquired(lease)) => taken.push(lease),
                _ => {}
            }
        }
        self.release_all(taken).await;
        Err(error.expect("the failed position holds an error"))
    }

    /// Gives back leases a call took but cannot hand out (its answer is an
    /// error): released unstarted (no work began, so the claims are
    /// refunded), the tasks are due at once. A release that fails leaves its
    /// lease to expire, as a crash would (and then it counts).
    async fn release_all(&self, leases: Vec<Lease>) {
        for lease in leases {
            if let Err(e) = Backend::release_unstarted(self, lease).await {
                tracing::warn!(error = %e, "could not give back a lease; it will expire");
            }
        }
    }
}
