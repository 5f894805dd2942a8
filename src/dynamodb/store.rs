//! [`DynamoStore`] and its operations: every fenced write one conditional
//! request (`UpdateItem` or `TransactWriteItems`) whose condition carries the
//! guard, a refused write classified from its `ALL_OLD` image by the same
//! [`rules`] functions every backend uses.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, DeleteRequest, KeysAndAttributes, Put,
    ReturnValuesOnConditionCheckFailure, Select, TransactWriteItem, Update, WriteRequest,
};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::backend::rules::{self, CancelRule, ClaimRule, LeaseCheck, ReopenRule};
use crate::backend::{Backend, InspectBackend, entry, jitter_unit, new_lease, new_task, renewed};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, InvalidInput, Result};
use crate::inspect::{Counts, Cursor, Order, Page, Story, TaskQuery};
use crate::limits;
use crate::policy::{AcceptanceRule, Failure};
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimNext, ClaimRequest, Fenced, Lease, Rejection, ReopenRequest,
    Reopening, Retry, Submitted,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};

use super::item::{self, Item, at, b, n, s};
use super::table::{
    DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY, PURGE_AT, PURGE_INDEX, PURGE_SHARD, SORT_KEY, STATUS_INDEX,
    TTL, UNCLAIMED_AT, UNCLAIMED_INDEX, UNCLAIMED_SHARD,
};
use super::with::{ExtraRefused, WithItems};
use super::{MAX_EXTRA_ITEMS, MAX_PAYLOAD_LEN, MAX_RESPONSE_LEN};

/// How often a write refused by a condition, whose `ALL_OLD` image then says
/// it should pass (the item changed in between), is tried again.
const RACE_RETRIES: usize = 4;
/// How often a transaction cancelled for a `TransactionConflict` (another
/// transaction held the item) is tried again, with a short growing pause.
const CONFLICT_RETRIES: u32 = 10;
/// The pause before try `tries + 1` of a request DynamoDB turned away for the
/// moment (a conflict, throttling, unprocessed keys): exponential from 2 ms,
/// at most about 128 ms, with full jitter so racing callers spread out.
fn pause(tries: u32) -> Duration {
    let ceiling = Duration::from_millis(1 << tries.clamp(1, 7));
    ceiling.mul_f64(0.5 + 0.5 * jitter_unit(AttemptId::new()))
}

/// Deletes per `BatchWriteItem`, DynamoDB's maximum.
const BATCH_DELETE: usize = 25;
/// Keys per `BatchGetItem`, DynamoDB's maximum.
const BATCH_GET: usize = 100;
/// Requests a batch operation (`claim_many`, `complete_many`, the reads of
/// a listing) has in flight at once.
const CONCURRENCY: usize = 32;
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
    client: Client,
    table: Arc<str>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("clock", &self.clock)
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
        })
    }
}

/// What to run when the table is missing.
const CREATE_TABLE_FIX: &str = "create the table: `taskfence::dynamodb::create_table`, or `taskfence migrate` \
     from the command line (a table named only by your own items of `with(items)` is yours to create)";

/// An SDK error as this crate's: a table that does not exist is
/// [`Error::NotMigrated`] (create it); anything else a storage error.
pub(super) fn sdk<E, R>(err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    if err.code() == Some("ResourceNotFoundException") {
        return Error::NotMigrated {
            detail: err.message().unwrap_or("table not found").to_owned(),
            fix: CREATE_TABLE_FIX,
        };
    }
    Error::storage(err)
}

/// A write kept being refused while its `ALL_OLD` image said it should pass,
/// or kept meeting other transactions on the same item.
#[derive(Debug, thiserror::Error)]
#[error("{0}: the item kept changing between the write and its check")]
struct Raced(&'static str);

/// A condition that cannot fail on a consistent table did.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Inconsistent(String);

/// An update expression with its condition, names and values, built up one
/// attribute at a time (every name goes through `#name`: `status`, `key`,
/// `ttl` and friends are reserved words).
#[derive(Debug, Default)]
struct Expr {
    set: Vec<String>,
    remove: Vec<String>,
    cond: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Expr {
    fn name(&mut self, attr: &str) -> String {
        let placeholder = format!("#{attr}");
        self.names.insert(placeholder.clone(), attr.to_owned());
        placeholder
    }
    fn set(mut self, attr: &str, value: AttributeValue) -> Self {
        let name = self.name(attr);
        self.values.insert(format!(":{attr}"), value);
        self.set.push(format!("{name} = :{attr}"));
        self
    }
    /// Sets `attr` only where it has no value yet.
    fn set_if_absent(mut self, attr: &str, value: AttributeValue) -> Self {
        let name = self.name(attr);
        self.values.insert(format!(":{attr}"), value);
        self.set.push(format!("{name} = if_not_exists({name}, :{attr})"));
        self
    }
    fn remove(mut self, attr: &str) -> Self {
        let name = self.name(attr);
        self.remove.push(name);
        self
    }
    /// Adds a condition clause; `attrs` are the names it uses as `#attr`,
    /// `values` its `:placeholder`s.
    fn cond(mut self, clause: &str, attrs: &[&str], values: Vec<(&str, AttributeValue)>) -> Self {
        for attr in attrs {
            self.name(attr);
        }
        self.values
            .extend(values.into_iter().map(|(k, v)| (k.to_owned(), v)));
        self.cond.push(format!("({clause})"));
        self
    }
    fn update_expression(&self) -> String {
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
    fn condition(&self) -> Option<String> {
        (!self.cond.is_empty()).then(|| self.cond.join(" AND "))
    }
    fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }
    fn values(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }

    /// This expression as a transaction item updating `key`.
    fn update(self, table: &str, key: Item) -> TransactWriteItem {
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
    fn check(self, table: &str, key: Item) -> TransactWriteItem {
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

/// What a transaction did.
enum Tx {
    Written,
    /// Item 0 (the task, or the dedup record of a submit) failed its
    /// condition; here is its image before the request (`None`: no such item).
    Refused(Option<Item>),
    /// The dedup record at the position the caller named failed its
    /// condition: the request key names other work now.
    KeyTaken(Option<Item>),
}

/// Where a transaction's items are: the application's own from `extra_from`
/// on, and the task's dedup record, when the caller's condition on it can
/// fail, at `key_at`.
#[derive(Clone, Copy)]
struct Layout {
    extra_from: usize,
    key_at: Option<usize>,
}

impl Layout {
    /// Only taskfence's items, none of whose refusals but item 0's is expected.
    const OWN: Layout = Layout {
        extra_from: usize::MAX,
        key_at: None,
    };

    /// The application's items from `extra_from` on.
    fn extra_from(extra_from: usize) -> Self {
        Self {
            extra_from,
            key_at: None,
        }
    }
}

/// The guard of a fenced write (guarantee 5), as a condition on the task item:
/// this assignment, still running, its lease unexpired on the writer's clock
/// (a running task has no response, so "no response yet" is implied).
fn fence(e: Expr, version: u64, now: OffsetDateTime) -> Expr {
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
fn unchanged(e: Expr, task: &Task) -> Expr {
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
fn claimable(e: Expr, task: &Task, now: OffsetDateTime) -> Expr {
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
fn attempt_update(e: Expr) -> Expr {
    e.cond("attribute_exists(#pk)", &[PARTITION_KEY], Vec::new())
}

/// Makes the task terminal, on the item and on the snapshot alike (the same
/// fields `MemoryStore` changes): no lease, no backoff, finished now, in the
/// purge index, out of the due and unclaimed indexes.
fn terminal(
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
fn finish_if_running(outcome: AttemptOutcome, now: OffsetDateTime) -> Expr {
    attempt_update(Expr::default())
        .set_if_absent(item::FINISHED_AT, at(now))
        .set_if_absent(item::OUTCOME, s(outcome.as_str()))
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

    /// The writes that can carry the application's own items in the same
    /// `TransactWriteItems` (the user's message with its task, the reply with
    /// its completion): all of them are written, or none. DynamoDB's
    /// counterpart of `PgStore::on` (the operations in the caller's
    /// PostgreSQL transaction); see [`WithItems`].
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
    /// let items = vec![TransactWriteItem::builder().put(message).build()];
    /// let task = store.with(items).submit(new).await?.into_task();
    /// # Ok(()) }
    /// ```
    pub fn with(&self, items: Vec<TransactWriteItem>) -> WithItems<'_> {
        WithItems::new(self, items)
    }

    fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }

    pub(super) async fn submit_items(
        &self,
        new: NewTask,
        extra: Vec<TransactWriteItem>,
    ) -> Result<Submitted> {
        let now = self.now();
        let expires_at = now + new.retention;
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
        let mut items = vec![put(key_item), put(task_item)];
        items.extend(extra);
        for _ in 0..RACE_RETRIES {
            match self
                .transact("submit", items.clone(), Layout::extra_from(2))
                .await?
            {
                Tx::Written => {
                    tracing::Span::current().record("task_id", tracing::field::display(task.id));
                    return Ok(Submitted::Created(task));
                }
                Tx::Refused(None) => continue, // the record went away: try again
                Tx::Refused(Some(old)) => {
                    let (existing, hash) = item::dedup(&old).map_err(Error::storage)?;
                    if hash != task.input_hash {
                        return Err(Error::KeyConflict { existing });
                    }
                    match self.read_task(existing).await? {
                        Some(found) => return Ok(Submitted::Existing(found)),
                        None => continue, // purged between the two requests
                    }
                }
                Tx::KeyTaken(_) => unreachable!("only a reopening names its dedup record's position"),
            }
        }
        Err(Error::storage(Raced("submit")))
    }

    async fn read_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.read_item(id)
            .await?
            .map(|i| item::task(&i).map_err(Error::storage))
            .transpose()
    }

    /// The task item, read consistently.
    async fn read_item(&self, id: TaskId) -> Result<Option<Item>> {
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
        for _ in 0..RACE_RETRIES {
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
                    let until = now + request.lease;
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
                    Some(until)
                }
            };
            if task.status == Status::Running {
                // The previous assignment, taken over or out of budget, ends as
                // expired. (A pending task's last attempt has ended already.)
                let key = item::key_of(pk.clone(), &item::attempt_sk(task.version));
                items.push(finish_if_running(AttemptOutcome::Expired, now).update(&self.table, key));
            }
            match self.transact("claim", items, Layout::OWN).await? {
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
                Tx::Refused(Some(old)) => task = item::task(&old).map_err(Error::storage)?,
                Tx::KeyTaken(_) => unreachable!("only a reopening names its dedup record's position"),
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
                Tx::KeyTaken(_) => unreachable!("only a reopening names its dedup record's position"),
            }
        }
        Err(Error::storage(Raced("complete")))
    }

    /// Reads the task, decides with [`rules::reopen`], and writes the
    /// reopened task, its dedup record (live again: no TTL, retention
    /// restarted) and the reopening item in one transaction conditioned on
    /// the state read, like a cancellation; a refusal decides again on its image.
    ///
    /// A task a purge has claimed (its retention passed) is gone for a
    /// reopening: [`Error::NotFound`], as once the purge has finished.
    async fn reopen_task(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
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
            // Pending and due at once (in the due index, so a re-dispatch
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
            let items = vec![
                e.update(&self.table, item::key_of(pk.clone(), item::TASK_SK)),
                record.update(&self.table, item::key_of(item::key_pk(&task.key), item::KEY_SK)),
                TransactWriteItem::builder().put(put).build(),
            ];
            let layout = Layout {
                extra_from: usize::MAX,
                key_at: Some(1),
            };
            match self.transact("reopen", items, layout).await? {
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
            }
        }
        Err(Error::storage(Raced("reopen")))
    }

    /// Runs a fenced write of `lease`: `items` builds the transaction for the
    /// writer's instant (its first item the guarded task update). A refusal
    /// is classified from the `ALL_OLD` image by `check`; should the check
    /// pass on it (the item changed in between), the write is tried again.
    async fn fenced_tx<T>(
        &self,
        op: &'static str,
        check: LeaseCheck,
        lease: &Lease,
        items: impl Fn(OffsetDateTime) -> (Vec<TransactWriteItem>, T),
    ) -> Result<Fenced<T>> {
        for _ in 0..RACE_RETRIES {
            let now = self.now();
            let (items, value) = items(now);
            match self.transact(op, items, Layout::OWN).await? {
                Tx::Written => return Ok(Fenced::Accepted(value)),
                Tx::Refused(None) => return Err(Error::NotFound(lease.task_id())),
                Tx::Refused(Some(old)) => {
                    let old = item::task(&old).map_err(Error::storage)?;
                    if let Err(rejection) = check(&old, lease.version(), now) {
                        tracing::debug!(%rejection, "fenced write rejected");
                        return Ok(Fenced::Rejected(rejection));
                    }
                }
                Tx::KeyTaken(_) => unreachable!("only a reopening names its dedup record's position"),
            }
        }
        Err(Error::storage(Raced(op)))
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

    /// Sends a transaction. A cancellation is read item by item: a failed
    /// condition on item 0 is [`Tx::Refused`] with its image, on an item at
    /// or after `extra_from` it is the application's [`ExtraRefused`].
    async fn transact(&self, op: &'static str, items: Vec<TransactWriteItem>, layout: Layout) -> Result<Tx> {
        let mut conflicts = 0;
        loop {
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .send()
                .await;
            let Err(err) = sent else {
                return Ok(Tx::Written);
            };
            let reasons = match &err {
                SdkError::ServiceError(service) => match service.err() {
                    TransactWriteItemsError::TransactionCanceledException(c) => {
                        c.cancellation_reasons().to_vec()
                    }
                    _ => return Err(sdk(err)),
                },
                _ => return Err(sdk(err)),
            };
            let code = |i: usize| reasons.get(i).and_then(|r| r.code()).unwrap_or("None");
            if let Some(i) = (0..reasons.len()).find(|&i| code(i) == "ConditionalCheckFailed") {
                let image = reasons[i].item().cloned();
                if i == 0 {
                    return Ok(Tx::Refused(image));
                }
                if layout.key_at == Some(i) {
                    return Ok(Tx::KeyTaken(image));
                }
                if i >= layout.extra_from {
                    return Err(Error::ItemRefused(Box::new(ExtraRefused {
                        index: i - layout.extra_from,
                        item: image,
                    })));
                }
                return Err(Error::storage(Inconsistent(format!(
                    "{op}: taskfence item {i} of the transaction failed its condition"
                ))));
            }
            // Another transaction held an item for a moment, or the table
            // was over its capacity: nothing was written; try again after a pause.
            let transient = reasons.iter().any(|r| {
                matches!(
                    r.code(),
                    Some("TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded")
                )
            });
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

    async fn query_all(
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

    async fn attempt_items(&self, id: TaskId) -> Result<Vec<Item>> {
        self.query_all(
            None,
            "#pk = :pk AND begins_with(#sk, :prefix)",
            HashMap::from([
                ("#pk".to_owned(), PARTITION_KEY.to_owned()),
                ("#sk".to_owned(), SORT_KEY.to_owned()),
            ]),
            HashMap::from([
                (":pk".to_owned(), s(item::task_pk(id))),
                (":prefix".to_owned(), s(item::ATTEMPT_PREFIX)),
            ]),
            None,
        )
        .await
    }

    /// A task's attempt and reopening items: every item of its partition
    /// that sorts before the task item (`A#…`, `R#…` < `T`).
    async fn child_items(&self, id: TaskId) -> Result<Vec<Item>> {
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

    /// Removes one expired terminal task. First the purge claims it: a mark
    /// on the task item that only a terminal task past its retention accepts
    /// and that a reopening refuses, so nothing below runs under a task that
    /// lives again. Then its dedup record (only if it is still this task's),
    /// its attempts and reopenings, and the task item last: an interrupted
    /// purge leaves the task marked and in the purge index, and the next one
    /// claims it again (the mark passes its own condition) and finishes.
    async fn purge_one(&self, id: TaskId, key: &RequestKey, now: OffsetDateTime) -> Result<bool> {
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
            .send()
            .await;
        match claimed {
            Ok(_) => {}
            // Reopened (or purged) since the index listed it: not expired work.
            Err(SdkError::ServiceError(service))
                if matches!(service.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                return Ok(false);
            }
            Err(err) => return Err(sdk(err)),
        }
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
        let children = self.child_items(id).await?;
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
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx("fail", rules::fence, &lease, |now| {
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

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx("release", rules::fence, &lease, |now| {
            // Due again from now on: in the due index, so `due` and
            // `claim_next` find it.
            let task = fence(Expr::default(), lease.version(), now)
                .set(item::STATUS, s(Status::Pending.as_str()))
                .remove(item::LEASE_UNTIL)
                .set(item::NOT_BEFORE, at(now))
                .set(DUE_SHARD, s(DUE_INDEX))
                .set(DUE_AT, at(now));
            let attempt = attempt_update(Expr::default())
                .set(item::FINISHED_AT, at(now))
                .set(item::OUTCOME, s(AttemptOutcome::Released.as_str()));
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
                Tx::KeyTaken(_) => unreachable!("only a reopening names its dedup record's position"),
            }
        }
        Err(Error::storage(Raced("cancel")))
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let pk = item::task_pk(lease.task_id());
        self.fenced_tx("record_operation", rules::fence, lease, |now| {
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
        })
        .await
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        self.reopen_task(id, request).await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        self.attempt_items(id)
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
        candidates.sort_unstable_by_key(|(since, id, _)| (*since, *id));
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
            let mut round: Vec<_> = round.into_iter().map(Some).collect();
            let claims = Self::concurrently(round.len(), |i| {
                let (store, claim) = (self.clone(), request.request());
                let (id, task) = round[i].take().expect("each candidate is claimed once");
                async move { store.claim_read(id, task, claim).await }
                    .instrument(entry::span("claim", Some(id)))
            })
            .await?;
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
}

/// Every status, in the order `list` merges and `counts` adds them.
const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Running,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// The `status` index's filter expression for `query`'s scope, operation
/// and submission range (`None`: no filter, every entry matches).
fn list_filter(
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

/// The task id an index entry or item carries.
fn task_id_of(entry: &Item) -> Result<TaskId> {
    let pk = entry
        .get(PARTITION_KEY)
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str);
    item::task_id_of_pk(pk).map_err(Error::storage)
}

impl DynamoStore {
    /// Up to `limit` ids from the due index: a backoff passed, a lease
    /// expired, a release or a reopening, by `now`; earliest first.
    async fn due_ids(&self, now: OffsetDateTime, limit: usize) -> Result<Vec<TaskId>> {
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
    async fn unclaimed_ids(&self, limit: usize) -> Result<Vec<TaskId>> {
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
    /// error): released, the tasks are due at once. A release that fails
    /// leaves its lease to expire, as a crash would.
    async fn release_all(&self, leases: Vec<Lease>) {
        for lease in leases {
            if let Err(e) = Backend::release(self, lease).await {
                tracing::warn!(error = %e, "could not give back a lease; it will expire");
            }
        }
    }

    /// Runs `make(i)` for `i` in `0..n` as tasks of the runtime, at most
    /// [`CONCURRENCY`] at once, and returns their outputs in order. Dropping
    /// the returned future aborts what is still running.
    async fn concurrently<T, Fut>(n: usize, mut make: impl FnMut(usize) -> Fut) -> Result<Vec<T>>
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
    async fn batch_get(&self, ids: &[TaskId]) -> Result<HashMap<TaskId, Item>> {
        // DynamoDB refuses a request that names one key twice.
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let chunks: Vec<Vec<TaskId>> = ids.chunks(BATCH_GET).map(<[TaskId]>::to_vec).collect();
        let read = Self::concurrently(chunks.len(), |i| {
            let (store, chunk) = (self.clone(), chunks[i].clone());
            async move { store.batch_get_chunk(&chunk).await }
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

    async fn batch_get_chunk(&self, ids: &[TaskId]) -> Result<Vec<Item>> {
        let mut keys: Vec<Item> = ids
            .iter()
            .map(|id| item::key_of(item::task_pk(*id), item::TASK_SK))
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        let mut tries = 0;
        while !keys.is_empty() {
            if tries > 0 {
                if tries > CONFLICT_RETRIES {
                    return Err(Error::storage(Raced("batch read")));
                }
                // Throttled or over 16 MB: the rest comes in the next request.
                tokio::time::sleep(pause(tries)).await;
            }
            tries += 1;
            let wanted = KeysAndAttributes::builder()
                .set_keys(Some(keys))
                .consistent_read(true)
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

    /// Up to `want` ids of tasks in `status` that pass `query`'s filters and
    /// lie beyond its cursor, in its order, from the `status` index.
    async fn status_ids(&self, status: Status, query: &TaskQuery, want: usize) -> Result<Vec<TaskId>> {
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
        // whole pages (1 MB) until enough pass.
        let page_limit = filter.is_none().then(|| i32::try_from(want).unwrap_or(i32::MAX));
        let mut ids = Vec::new();
        let mut start = None;
        loop {
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
            start = page.last_evaluated_key().cloned();
            if start.is_none() || ids.len() >= want {
                ids.truncate(want);
                return Ok(ids);
            }
        }
    }

    /// How many tasks in `status` (of `scope`): `Select=COUNT` over the
    /// status's whole index partition, page by page.
    async fn count_status(&self, status: Status, scope: Option<String>) -> Result<u64> {
        let mut total = 0u64;
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
                .set_exclusive_start_key(start);
            if let Some(scope) = &scope {
                request = request
                    .filter_expression("#scope = :scope")
                    .expression_attribute_names("#scope", item::SCOPE)
                    .expression_attribute_values(":scope", s(scope));
            }
            let page = request.send().await.map_err(sdk)?;
            total += u64::try_from(page.count()).unwrap_or(0);
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(total);
            }
        }
    }
}

#[async_trait]
impl InspectBackend for DynamoStore {
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
        let mut items = self.batch_get(&ids).await?;
        let mut tasks = Vec::with_capacity(ids.len());
        for id in &ids {
            let Some(found) = items.remove(id) else { continue }; // purged meanwhile
            let task = item::task(&found).map_err(Error::storage)?;
            // The index lags the table a moment: the table's word is final.
            if query.matches(&task) {
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

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        // The task's partition holds it all, in order: attempts (A#),
        // reopenings (R#), the task (T). One consistent query.
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
            }
        }
        Ok(Some(story))
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
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
            let mut items = self.batch_get(&ids).await?;
            for id in ids {
                let Some(found) = items.remove(&id) else { continue };
                let task = item::task(&found).map_err(Error::storage)?;
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

/// An item's sort key.
fn sort_key(found: &Item) -> &str {
    found
        .get(SORT_KEY)
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str)
}
