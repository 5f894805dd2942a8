//! Transactions and errors: sending a `TransactWriteItems` and reading its
//! cancellation reasons (a refused condition, the application's item, a
//! conflict or throttling to retry after a jittered pause), the fenced-write
//! loop, and SDK errors as this crate's.

use std::fmt;
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;
use time::OffsetDateTime;

use crate::backend::jitter_unit;
use crate::backend::rules::LeaseCheck;
use crate::error::{Error, Result};
use crate::store::{Fenced, Lease};
use crate::task::AttemptId;

use super::item::{self, Item};
use super::store::DynamoStore;
use super::with::ExtraRefused;

/// How often a write refused by a condition, whose `ALL_OLD` image then says
/// it should pass (the item changed in between), is tried again.
pub(super) const RACE_RETRIES: usize = 4;

/// How often a transaction cancelled for a `TransactionConflict` (another
/// transaction held the item) is tried again, with a short growing pause.
pub(super) const CONFLICT_RETRIES: u32 = 10;

/// The pause before try `tries + 1` of a request DynamoDB turned away for the
/// moment (a conflict, throttling, unprocessed keys): exponential from 2 ms,
/// at most about 128 ms, with full jitter so racing callers spread out.
pub(super) fn pause(tries: u32) -> Duration {
    let ceiling = Duration::from_millis(1 << tries.clamp(1, 7));
    ceiling.mul_f64(0.5 + 0.5 * jitter_unit(AttemptId::new()))
}

/// What to run when the table is missing.
pub(super) const CREATE_TABLE_FIX: &str = "create the table: `taskfence::dynamodb::create_table`, or `taskfence migrate` \
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
pub(super) struct Raced(pub(super) &'static str);

/// A condition that cannot fail on a consistent table did.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Inconsistent(String);

/// What a transaction did.
pub(super) enum Tx {
    Written,
    /// Item 0 (the task, or the dedup record of a submit) failed its
    /// condition; here is its image before the request (`None`: no such item).
    Refused(Option<Item>),
    /// The dedup record at the position the caller named failed its
    /// condition: the request key names other work now.
    KeyTaken(Option<Item>),
    /// The record at the position the caller named (an effect item) failed
    /// its condition: another write changed it since it was read (the
    /// caller reads it again).
    RecordChanged,
}

/// Where a transaction's items are: the application's own from `extra_from`
/// on, the task's dedup record, when the caller's condition on it can
/// fail, at `key_at`, and a record written on the condition that it is
/// still as read, at `record_at`.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    pub(super) extra_from: usize,
    pub(super) key_at: Option<usize>,
    pub(super) record_at: Option<usize>,
    /// Records conditioned on their state as read, at `start..end` (a
    /// claim's or submission's concurrency key and bucket items).
    pub(super) records: Option<(usize, usize)>,
}

impl Layout {
    /// Only taskfence's items, none of whose refusals but item 0's is expected.
    pub(super) const OWN: Layout = Layout {
        extra_from: usize::MAX,
        key_at: None,
        record_at: None,
        records: None,
    };

    /// The application's items from `extra_from` on.
    pub(super) fn extra_from(extra_from: usize) -> Self {
        Self {
            extra_from,
            ..Self::OWN
        }
    }

    /// The task's dedup record at `key_at`.
    pub(super) fn key_at(key_at: usize) -> Self {
        Self {
            key_at: Some(key_at),
            ..Self::OWN
        }
    }

    /// Records conditioned on their state as read at `start..end`.
    pub(super) fn records(self, start: usize, end: usize) -> Self {
        Self {
            records: (start < end).then_some((start, end)),
            ..self
        }
    }

    /// A record conditioned on its state as read at `record_at`.
    pub(super) fn record_at(record_at: usize) -> Self {
        Self {
            record_at: Some(record_at),
            ..Self::OWN
        }
    }
}

impl DynamoStore {
    /// Sends a transaction. A cancellation is read item by item: a failed
    /// condition on item 0 is [`Tx::Refused`] with its image, on the items
    /// `layout` names [`Tx::KeyTaken`] or [`Tx::RecordChanged`], on an item
    /// at or after `extra_from` the application's [`ExtraRefused`].
    pub(super) async fn transact(
        &self,
        op: &'static str,
        items: Vec<TransactWriteItem>,
        layout: Layout,
    ) -> Result<Tx> {
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
                if layout.record_at == Some(i)
                    || layout
                        .records
                        .is_some_and(|(start, end)| (start..end).contains(&i))
                {
                    return Ok(Tx::RecordChanged);
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

    /// Runs a fenced write of `lease`: `items` builds the transaction for the
    /// writer's instant (its first item the guarded task update, or check;
    /// the application's items, if any, where `layout` says). A refusal
    /// is classified from the `ALL_OLD` image by `check`; should the check
    /// pass on it (the item changed in between), the write is tried again.
    ///
    /// The guard and `check` compare the lease's version, not its attempt
    /// id ([`rules::granted`](crate::backend::rules::granted)): here a claim
    /// that answered with a lease is committed (one `TransactWriteItems`,
    /// the application's items of [`DynamoStore::with`](super::DynamoStore::with)
    /// included, all written or none, before the answer), so no claim is
    /// ever undone and a version names one attempt.
    pub(super) async fn fenced_tx<T>(
        &self,
        op: &'static str,
        check: LeaseCheck,
        lease: &Lease,
        layout: Layout,
        items: impl Fn(OffsetDateTime) -> (Vec<TransactWriteItem>, T),
    ) -> Result<Fenced<T>> {
        self.fenced_tx_with(op, check, lease, layout, &[], items).await
    }

    /// [`fenced_tx`](Self::fenced_tx) with the application's `extra` items
    /// after taskfence's own (when there are any, they set the layout).
    pub(super) async fn fenced_tx_with<T>(
        &self,
        op: &'static str,
        check: LeaseCheck,
        lease: &Lease,
        layout: Layout,
        extra: &[TransactWriteItem],
        items: impl Fn(OffsetDateTime) -> (Vec<TransactWriteItem>, T),
    ) -> Result<Fenced<T>> {
        for _ in 0..RACE_RETRIES {
            let now = self.now();
            let (mut items, value) = items(now);
            let layout = if extra.is_empty() {
                layout
            } else {
                Layout::extra_from(items.len())
            };
            items.extend(extra.iter().cloned());
            match self.transact(op, items, layout).await? {
                Tx::Written => return Ok(Fenced::Accepted(value)),
                Tx::Refused(None) => return Err(Error::NotFound(lease.task_id())),
                Tx::Refused(Some(old)) => {
                    let old = item::task(&old).map_err(Error::storage)?;
                    if let Err(rejection) = check(&old, lease.version(), now) {
                        tracing::debug!(%rejection, "fenced write rejected");
                        return Ok(Fenced::Rejected(rejection));
                    }
                }
                Tx::KeyTaken(_) | Tx::RecordChanged => unreachable!("this layout names no other item"),
            }
        }
        Err(Error::storage(Raced(op)))
    }
}
