//! [`WithItems`]: a [`DynamoStore`] whose next write carries the
//! application's own items in the same `TransactWriteItems` — a
//! [`TaskStore`](crate::TaskStore) and [`Inspect`](crate::inspect::Inspect)
//! as far as DynamoDB transactions allow — and [`ExtraRefused`], the refusal
//! of one of those items.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use tracing::Instrument;

use crate::backend::rules::Work;
use crate::backend::{Backend, InspectBackend, entry};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{InvalidInput, Result};
use crate::inspect::{CappedCounts, Counts, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::policy::Failure;
use crate::store::{Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

use super::DynamoStore;
use super::store::{check_extra, check_payload, check_response};

/// A [`DynamoStore`] whose next write carries the application's own items
/// in the same `TransactWriteItems`, made by [`DynamoStore::with`]: all of the
/// items are written with the task's change, or none. It is a
/// [`TaskStore`](crate::TaskStore) and an [`Inspect`](crate::inspect::Inspect),
/// so code written against a store (an interceptor,
/// [`metrics::observe`](crate::metrics), a `&dyn TaskStore`) can make that
/// write; DynamoDB has no open transaction to run other operations in, so
/// the handle is exactly what one `TransactWriteItems` allows:
///
/// | operations | on this handle |
/// | --- | --- |
/// | `submit`, `complete`, `fail`, `release`, `release_unstarted`, `record_operation`, [`write`](Self::write) | **carry the items**: one transaction with the task's own items; a refusal ([`Fenced::Rejected`], a key conflict, an item's condition) writes none of them |
/// | `get`, `find`, `attempts`, `effects`, `due`, and [`Inspect`](crate::inspect::Inspect)'s `list`, `counts`, `story`, `stranded` | run on the store: they write nothing, and read what is committed (DynamoDB transactions are one request: there is nothing uncommitted to read) |
/// | `claim`, `cancel`, `begin_effect`, `finish_effect` | **refused**: they may answer without writing (a busy or finished task, an effect already recorded), so the items' fate would not follow the answer |
/// | `reopen` | **refused**: an operator's action on a failed or cancelled task, written with its dedup record; it takes no application writes |
/// | `renew` | **refused**: one `UpdateItem`, not a transaction |
/// | `submit_many`, `claim_many`, `complete_many`, `renew_many`, `claim_next`, `purge_expired` | **refused**: one request per task, sent side by side; the items could join only one of them |
///
/// A refused operation is [`InvalidInput::CannotCarryItems`] (as
/// [`Error::InvalidInput`](crate::Error::InvalidInput)), nothing written, and
/// the items stay for the next write. The items go with the **first** write
/// that carries them, whatever its outcome: a later write on the same handle
/// is refused the same way (make a new handle for another write). At most
/// [`MAX_EXTRA_ITEMS`](super::MAX_EXTRA_ITEMS) items (DynamoDB's limit of 100
/// per transaction, less taskfence's own).
///
/// Side by side with PostgreSQL, where the application's writes share a
/// transaction with the task's through `PgStore::on(&mut tx)`:
///
/// | | PostgreSQL | DynamoDB |
/// | --- | --- | --- |
/// | the message with its task | `store.on(&mut tx).submit(new)`, then `tx.commit()` | `store.with(items).submit(new)` |
/// | the reply with its completion | `store.on(&mut tx).complete(lease, response)`, then `tx.commit()` | `store.with(items).complete(lease, response)` |
/// | the application's own condition fails | the application's statement fails; roll back | [`Error::ItemRefused`](crate::Error::ItemRefused) ([`ExtraRefused`]), nothing written |
/// | several operations, one commit | any operations, then `tx.commit()` | one write per handle |
///
/// ```no_run
/// # async fn f(store: taskfence::DynamoStore, lease: taskfence::Lease) -> taskfence::Result<()> {
/// use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
/// use taskfence::TaskStore;
/// let reply = Put::builder()
///     .table_name("replies")
///     .item("task_id", AttributeValue::S(lease.task_id().to_string()))
///     .item("body", AttributeValue::S("Here are the key decisions…".into()))
///     .build()
///     .expect("table and item are set");
/// let items = vec![TransactWriteItem::builder().put(reply).build()];
/// match store.with(items).complete(lease, "saved".into()).await? {
///     taskfence::Fenced::Accepted(_) => { /* reply and completion are both written */ }
///     taskfence::Fenced::Rejected(_) => { /* neither: someone else's answer stands */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "make a write (submit, complete, fail, release, release_unstarted, record_operation, write) to send the items"]
pub struct WithItems<'s> {
    store: &'s DynamoStore,
    /// The application's items, until a write takes them.
    items: Mutex<Option<Vec<TransactWriteItem>>>,
}

/// Why the items are gone.
const SPENT: &str = "an earlier write of this handle carried the items";

impl<'s> WithItems<'s> {
    pub(super) fn new(store: &'s DynamoStore, items: Vec<TransactWriteItem>) -> Self {
        Self {
            store,
            items: Mutex::new(Some(items)),
        }
    }

    /// The items, for the one write that carries them: refused when an
    /// earlier write took them, or when there are too many (they stay).
    fn take(&self, operation: &'static str) -> Result<Vec<TransactWriteItem>> {
        let mut items = self
            .items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = items
            .as_ref()
            .map(Vec::len)
            .ok_or(InvalidInput::CannotCarryItems {
                operation,
                why: SPENT,
            })?;
        check_extra(count)?;
        Ok(items.take().unwrap_or_default())
    }

    /// Writes the items under `lease`: one transaction with a condition
    /// check that the lease is current (its assignment, still running,
    /// unexpired on this store's clock), so the application's own writes made
    /// while working (partial results, index entries) land only while its
    /// lease is current. A superseded, expired or ended lease is
    /// [`Fenced::Rejected`] with the reason, and nothing is written.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore, lease: taskfence::Lease, items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>) -> taskfence::Result<()> {
    /// if store.with(items).write(&lease).await?.is_accepted() {
    ///     // the progress items are written, under a current lease
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, lease: &Lease) -> Result<Fenced<()>> {
        async {
            let items = self.take("write")?;
            self.store.fenced_items(lease, items).await
        }
        .instrument(entry::lease_span("fence", lease))
        .await
    }
}

/// [`InvalidInput::CannotCarryItems`] for an operation no single
/// `TransactWriteItems` with the items can make.
fn refuse<T>(operation: &'static str, why: &'static str) -> Result<T> {
    Err(InvalidInput::CannotCarryItems { operation, why }.into())
}

const MAY_ANSWER_WITHOUT_WRITING: &str = "it may answer without writing (a busy or finished task, an effect already recorded), so the items' fate would not follow the answer";
const OPERATOR_ACTION: &str =
    "reopening is an operator's action, written with its dedup record; it takes no application writes";
const NOT_A_TRANSACTION: &str = "a renewal is one UpdateItem, not a transaction";
const ONE_REQUEST_PER_TASK: &str =
    "it sends one request per task, side by side; the items could join only one of them";

/// The writes that carry the items, the reads on the store, the rest
/// refused (see the table on [`WithItems`]).
#[async_trait]
impl Backend for WithItems<'_> {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        check_payload(&task)?;
        let items = self.take("submit")?;
        self.store.submit_items(task, items).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        Backend::get(self.store, id).await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        Backend::find(self.store, key).await
    }

    async fn claim(&self, _: TaskId, _: ClaimRequest) -> Result<Claim> {
        refuse("claim", MAY_ANSWER_WITHOUT_WRITING)
    }

    async fn renew(&self, _: &mut Lease, _: Duration) -> Result<Fenced<()>> {
        refuse("renew", NOT_A_TRANSACTION)
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        check_response(&response)?;
        let items = self.take("complete")?;
        self.store.complete_items(lease, response, items).await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let items = self.take("fail")?;
        self.store.fail_items(lease, failure, &items).await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let items = self.take("release")?;
        self.store.release_items(lease, Work::Started, &items).await
    }

    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        let items = self.take("release_unstarted")?;
        self.store.release_items(lease, Work::NotStarted, &items).await
    }

    async fn cancel(&self, _: TaskId, _: &str) -> Result<Fenced<Task>> {
        refuse("cancel", MAY_ANSWER_WITHOUT_WRITING)
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let items = self.take("record_operation")?;
        self.store
            .record_operation_items(lease, operation_id, &items)
            .await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        Backend::attempts(self.store, id).await
    }

    async fn begin_effect(&self, _: &Lease, _: &str) -> Result<Fenced<EffectStart>> {
        refuse("begin_effect", MAY_ANSWER_WITHOUT_WRITING)
    }

    async fn finish_effect(&self, _: &Lease, _: &str, _: EffectOutcome) -> Result<Fenced<Effect>> {
        refuse("finish_effect", MAY_ANSWER_WITHOUT_WRITING)
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        Backend::effects(self.store, id).await
    }

    async fn reopen(&self, _: TaskId, _: ReopenRequest) -> Result<Fenced<Task>> {
        refuse("reopen", OPERATOR_ACTION)
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        Backend::due(self.store, limit).await
    }

    async fn purge_expired(&self, _: usize) -> Result<u64> {
        refuse("purge_expired", ONE_REQUEST_PER_TASK)
    }

    async fn submit_many(&self, _: Vec<NewTask>) -> Result<Vec<Result<Submitted>>> {
        refuse("submit_many", ONE_REQUEST_PER_TASK)
    }

    async fn claim_many(&self, _: &[TaskId], _: ClaimRequest) -> Result<Vec<Claim>> {
        refuse("claim_many", ONE_REQUEST_PER_TASK)
    }

    async fn complete_many(&self, _: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        refuse("complete_many", ONE_REQUEST_PER_TASK)
    }

    async fn claim_next(&self, _: ClaimNext) -> Result<Vec<Lease>> {
        refuse("claim_next", ONE_REQUEST_PER_TASK)
    }

    async fn renew_many(&self, _: &mut [Lease], _: Duration) -> Result<Vec<Fenced<()>>> {
        refuse("renew_many", ONE_REQUEST_PER_TASK)
    }
}

/// The operator's queries, on the store: they write nothing.
#[async_trait]
impl InspectBackend for WithItems<'_> {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        InspectBackend::list(self.store, query).await
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        InspectBackend::counts(self.store, scope).await
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        InspectBackend::counts_up_to(self.store, scope, cap).await
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        InspectBackend::story(self.store, id).await
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        InspectBackend::stranded(self.store, older_than, limit).await
    }

    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        InspectBackend::depth(self.store).await
    }
}

/// One of the application's items carried by [`WithItems`] was refused by
/// its own condition: the transaction was cancelled, nothing of it (the
/// task's change included) was written. It comes as
/// [`Error::ItemRefused`](crate::Error::ItemRefused), which is never
/// retryable; downcast to read it.
///
/// ```
/// # fn f(err: taskfence::Error) {
/// use taskfence::dynamodb::ExtraRefused;
/// if let taskfence::Error::ItemRefused(e) = &err {
///     if let Some(refused) = e.downcast_ref::<ExtraRefused>() {
///         println!("item {} refused; it was {:?}", refused.index, refused.item);
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[error("the application's transaction item {index} was refused by its condition; nothing was written")]
pub struct ExtraRefused {
    /// Its position among the items given to [`DynamoStore::with`].
    pub index: usize,
    /// Its item before the request, when the item asked for
    /// `ReturnValuesOnConditionCheckFailure::AllOld` and existed.
    pub item: Option<HashMap<String, AttributeValue>>,
}
