//! [`WithItems`]: DynamoDB's writes that carry the application's own items
//! in the same `TransactWriteItems`, and [`ExtraRefused`], the refusal of one
//! of those items.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use tracing::Instrument;

use crate::backend::entry;
use crate::error::Result;
use crate::store::{Fenced, Lease, Submitted};
use crate::task::{NewTask, Response, Task};

use super::DynamoStore;
use super::store::{check_extra, check_payload, check_response};

/// [`DynamoStore`]'s writes with the application's own items in the same
/// `TransactWriteItems`, made by [`DynamoStore::with`]: all of the items are
/// written with the task's change, or none.
///
/// Side by side with PostgreSQL, where the application's writes share a
/// transaction with the task's through `PgStore::on(&mut *tx)`:
///
/// | | PostgreSQL | DynamoDB |
/// | --- | --- | --- |
/// | the message with its task | `store.on(&mut tx).submit(new)`, then `tx.commit()` | `store.with(items).submit(new)` |
/// | the reply with its completion | `store.on(&mut tx).complete(lease, response)`, then `tx.commit()` | `store.with(items).complete(lease, response)` |
/// | the application's own condition fails | the application's statement fails; roll back | [`Error::ItemRefused`](crate::Error::ItemRefused) ([`ExtraRefused`]), nothing written |
///
/// At most [`MAX_EXTRA_ITEMS`](super::MAX_EXTRA_ITEMS) items (DynamoDB's
/// limit of 100 per transaction, less taskfence's own).
///
/// ```no_run
/// # async fn f(store: taskfence::DynamoStore, lease: taskfence::Lease) -> taskfence::Result<()> {
/// use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
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
#[must_use = "call submit or complete to write"]
pub struct WithItems<'s> {
    store: &'s DynamoStore,
    items: Vec<TransactWriteItem>,
}

impl<'s> WithItems<'s> {
    pub(super) fn new(store: &'s DynamoStore, items: Vec<TransactWriteItem>) -> Self {
        Self { store, items }
    }

    /// [`TaskStore::submit`](crate::TaskStore::submit) with the items: when
    /// the key exists already (the same task, or
    /// [`Error::KeyConflict`](crate::Error::KeyConflict)) or an item's
    /// condition fails, none of the items is written either.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore, new: taskfence::NewTask, items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>) -> taskfence::Result<()> {
    /// let task = store.with(items).submit(new).await?.into_task();
    /// # Ok(()) }
    /// ```
    pub async fn submit(self, mut task: NewTask) -> Result<Submitted> {
        let span = entry::submit(&mut task)?;
        check_payload(&task)?;
        check_extra(self.items.len())?;
        self.store.submit_items(task, self.items).instrument(span).await
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
    pub async fn write(self, lease: &Lease) -> Result<Fenced<()>> {
        check_extra(self.items.len())?;
        self.store
            .fenced_items(lease, self.items)
            .instrument(entry::lease_span("fence", lease))
            .await
    }

    /// [`TaskStore::complete`](crate::TaskStore::complete) with the items: a
    /// refused completion ([`Fenced::Rejected`]) or a refused item writes
    /// nothing.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::DynamoStore, lease: taskfence::Lease, items: Vec<aws_sdk_dynamodb::types::TransactWriteItem>) -> taskfence::Result<()> {
    /// let saved = store.with(items).complete(lease, "the answer".into()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn complete(self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let span = entry::complete(&lease, &response)?;
        check_response(&response)?;
        check_extra(self.items.len())?;
        self.store
            .complete_items(lease, response, self.items)
            .instrument(span)
            .await
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
