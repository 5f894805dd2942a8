//! [`Disposition`]: what the queue adapter does with a message, with the
//! reason, and how the store's answers map to it.

use std::time::Duration;

use time::OffsetDateTime;

#[cfg(doc)]
use super::{Worker, WorkerConfig};
use crate::clock::Clock;
#[cfg(doc)]
use crate::store::TaskStore;
use crate::store::{Claim, Lease, Rejection};
use crate::task::Status;
use crate::throttle::Throttled;

/// What the queue adapter must do with the message that carried the task id.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::{AckReason, Disposition, RetryReason};
/// fn sqs_action(d: &Disposition) -> String {
///     match d {
///         Disposition::Ack(_) => "DeleteMessage".into(),
///         Disposition::RetryAfter { delay, .. } => format!("ChangeMessageVisibility({}s)", delay.as_secs()),
///         Disposition::Leave(_) => "nothing".into(),
///     }
/// }
/// let d = Disposition::RetryAfter { delay: Duration::from_secs(4), reason: RetryReason::Busy };
/// assert_eq!(sqs_action(&d), "ChangeMessageVisibility(4s)");
/// assert!(Disposition::Ack(AckReason::Completed).is_ack());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Remove the message: the task is done or terminal, so no delivery of it
    /// needs any more work. Only returned after the store durably says so.
    Ack(AckReason),
    /// Keep the message but redeliver it after `delay`: the task is waiting
    /// out a backoff, or another worker holds a live lease on it.
    RetryAfter {
        /// How long until the next claim can succeed (worker clock, at least
        /// [`WorkerConfig::min_retry_delay`]).
        delay: Duration,
        /// Why the task cannot be worked on now.
        reason: RetryReason,
    },
    /// Do nothing with the message: this worker no longer holds the task (or
    /// the store failed to answer). The message timer brings it back, and the
    /// next claim reads the durable task and decides.
    Leave(LeaveReason),
}

impl Disposition {
    /// `true` for [`Disposition::Ack`].
    pub fn is_ack(&self) -> bool {
        matches!(self, Disposition::Ack(_))
    }
}

/// Why a message is acknowledged.
///
/// ```
/// assert_ne!(taskfence::runtime::AckReason::Completed, taskfence::runtime::AckReason::AlreadyCompleted);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AckReason {
    /// This call's response was saved.
    Completed,
    /// The task was already completed when claimed; the work function was not called.
    AlreadyCompleted,
    /// The work ran, but another attempt's response had been saved first (a
    /// renewal or the completion was refused with
    /// [`Rejection::AlreadyCompleted`]).
    CompletedElsewhere,
    /// The task is terminally failed (permanent failure or budget exhausted),
    /// by this attempt or an earlier one.
    Failed,
    /// The task was cancelled.
    Cancelled,
    /// No such task in the store (never submitted, or purged after retention).
    NotFound,
}

/// Why a message is redelivered later.
///
/// ```
/// let r = taskfence::runtime::RetryReason::Scheduled { attempts_left: 2 };
/// assert!(matches!(r, taskfence::runtime::RetryReason::Scheduled { .. }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// Another assignment holds a live lease (a duplicate delivery while it works).
    Busy,
    /// The task is waiting out the backoff of an earlier failed attempt.
    Backoff,
    /// This attempt failed and the policy scheduled another one.
    Scheduled {
        /// Claims still allowed by the budget.
        attempts_left: u32,
    },
    /// A stopping consumer gave the task back (released its lease, or never
    /// started it): another process can take it at once.
    Released,
    /// A limit refused the claim (see [`crate::throttle`]): redelivered when
    /// its bucket's next token is due, or after the minimum delay when a
    /// concurrency slot must free first.
    Throttled,
}

/// Why a message is left alone.
///
/// ```
/// use taskfence::{runtime::LeaveReason, Rejection};
/// let r = LeaveReason::LeaseLost(Some(Rejection::Superseded { current_version: 2 }));
/// assert!(matches!(r, LeaveReason::LeaseLost(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaveReason {
    /// The lease was lost while the work ran: a renewal was refused (with this
    /// rejection), or the store stayed unreachable past the lease's expiry
    /// (`None`). The work was told to stop and its result discarded.
    LeaseLost(Option<Rejection>),
    /// The final write (complete or fail) was refused: the assignment was
    /// superseded or its lease had expired.
    Rejected(Rejection),
    /// The store did not answer a claim, a completion or a failure report:
    /// the durable task decides at the next delivery (if the write happened,
    /// that delivery is acknowledged without work).
    StoreFailed,
}

/// A redelivery at `at` (store clock) as a delay on `clock`, at least `min`.
pub(crate) fn retry_at(
    clock: &dyn Clock,
    min: Duration,
    at: OffsetDateTime,
    reason: RetryReason,
) -> Disposition {
    let delay = Duration::try_from(at - clock.now()).unwrap_or(Duration::ZERO);
    Disposition::RetryAfter {
        delay: delay.max(min),
        reason,
    }
}

/// A claim that needs no work: `Ok` with what to tell the queue; `Err` with
/// the lease when the task was acquired. `retry_at` turns a store instant into
/// a redelivery.
#[allow(clippy::result_large_err)] // a short-lived return value, matched at once
pub(crate) fn settled(
    claim: Claim,
    retry_at: impl Fn(OffsetDateTime, RetryReason) -> Disposition,
) -> std::result::Result<Disposition, Lease> {
    Ok(match claim {
        Claim::Acquired(lease) => return Err(lease),
        Claim::Completed(_) => Disposition::Ack(AckReason::AlreadyCompleted),
        Claim::Failed(_) => Disposition::Ack(AckReason::Failed),
        Claim::Cancelled(_) => Disposition::Ack(AckReason::Cancelled),
        Claim::NotFound => Disposition::Ack(AckReason::NotFound),
        Claim::Busy { until } => retry_at(until, RetryReason::Busy),
        Claim::Backoff { not_before } => retry_at(not_before, RetryReason::Backoff),
        Claim::Throttled(Throttled::Rate { next, .. }) => retry_at(next, RetryReason::Throttled),
        // When a slot frees is not known: the minimum delay.
        Claim::Throttled(_) => retry_at(OffsetDateTime::UNIX_EPOCH, RetryReason::Throttled),
    })
}

/// A refused write that still settles the task for good: acknowledge.
pub(crate) fn terminal_ack(rejection: &Rejection) -> Option<Disposition> {
    match rejection {
        Rejection::AlreadyCompleted(_) | Rejection::NotRunning(Status::Completed) => {
            Some(Disposition::Ack(AckReason::CompletedElsewhere))
        }
        Rejection::NotRunning(Status::Failed) => Some(Disposition::Ack(AckReason::Failed)),
        Rejection::NotRunning(Status::Cancelled) => Some(Disposition::Ack(AckReason::Cancelled)),
        _ => None,
    }
}

/// The disposition of a refused complete or fail.
pub(crate) fn rejected(rejection: Rejection) -> Disposition {
    terminal_ack(&rejection).unwrap_or(Disposition::Leave(LeaveReason::Rejected(rejection)))
}
