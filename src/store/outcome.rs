//! What the store answers: a submission, a claim, a fenced write and its
//! refusal, a failure's retry.

use time::OffsetDateTime;

#[cfg(doc)]
use super::TaskStore;
use crate::lease::Lease;
use crate::task::{Status, Task, TaskId};
use crate::throttle::Throttled;

/// What [`TaskStore::submit`] did.
///
/// ```
/// # fn f(s: taskfence::Submitted) {
/// let created = s.is_created();
/// let task = s.into_task();
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// A new task was written.
    Created(Task),
    /// The key was seen before with the same inputs: this is that task, nothing was written.
    Existing(Task),
}

impl Submitted {
    /// The task, new or existing.
    pub fn task(&self) -> &Task {
        match self {
            Submitted::Created(t) | Submitted::Existing(t) => t,
        }
    }
    /// Takes the task out.
    pub fn into_task(self) -> Task {
        match self {
            Submitted::Created(t) | Submitted::Existing(t) => t,
        }
    }
    /// `true` for [`Submitted::Created`].
    pub fn is_created(&self) -> bool {
        matches!(self, Submitted::Created(_))
    }
}

/// The answer to [`TaskStore::claim`].
///
/// ```
/// use taskfence::Claim;
/// fn should_call_provider(c: &Claim) -> bool {
///     matches!(c, Claim::Acquired(_))
/// }
/// assert!(!should_call_provider(&Claim::NotFound));
/// ```
#[derive(Debug)]
pub enum Claim {
    /// This worker holds the task now. Do the work, then complete, fail or release.
    Acquired(Lease),
    /// Already done: here is the saved response. No attempt was counted.
    Completed(Task),
    /// Another assignment holds a live lease until this instant.
    Busy {
        /// When that lease expires (store clock).
        until: OffsetDateTime,
    },
    /// A retry is scheduled; claim again at or after this instant.
    Backoff {
        /// Earliest next claim (store clock).
        not_before: OffsetDateTime,
    },
    /// Terminally failed (permanent failure or budget exhausted). No attempt was counted.
    Failed(Task),
    /// Cancelled. No attempt was counted.
    Cancelled(Task),
    /// No such task.
    NotFound,
    /// Refused for a limit: its concurrency key is full, an older task of
    /// an in-order key goes first, or its rate bucket has no token (see
    /// [`crate::throttle`]). Nothing was written and no attempt was counted.
    Throttled(Throttled),
}

impl Claim {
    /// `true` for [`Claim::Acquired`].
    pub fn is_acquired(&self) -> bool {
        matches!(self, Claim::Acquired(_))
    }

    /// A short, stable name of the variant (`acquired`, `completed`, `busy`,
    /// `backoff`, `failed`, `cancelled`, `not_found`, `throttled`): the `outcome` label
    /// of the metrics, and a field for logs.
    ///
    /// ```
    /// assert_eq!(taskfence::Claim::NotFound.label(), "not_found");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Claim::Acquired(_) => "acquired",
            Claim::Completed(_) => "completed",
            Claim::Busy { .. } => "busy",
            Claim::Backoff { .. } => "backoff",
            Claim::Failed(_) => "failed",
            Claim::Cancelled(_) => "cancelled",
            Claim::NotFound => "not_found",
            Claim::Throttled(_) => "throttled",
        }
    }
}

/// Why a fenced write was refused. Nothing was written.
///
/// ```
/// use taskfence::{Rejection, Status};
/// let r = Rejection::Superseded { current_version: 3 };
/// assert_eq!(r.to_string(), "superseded by assignment version 3");
/// assert_eq!(Rejection::NotRunning(Status::Cancelled).to_string(), "task is cancelled, not running");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The task already has its saved response (here it is).
    #[error("task already completed")]
    AlreadyCompleted(Box<Task>),
    /// A newer assignment has claimed the task since this lease was granted.
    #[error("superseded by assignment version {current_version}")]
    Superseded {
        /// The task's current assignment version.
        current_version: u64,
    },
    /// This assignment is still current but its lease has expired (store clock).
    #[error("lease expired")]
    LeaseExpired,
    /// The task is not running (cancelled, failed, released or retrying).
    #[error("task is {0}, not running")]
    NotRunning(Status),
    /// A [reopening](TaskStore::reopen) of a task that is still pending or
    /// running: only a failed or cancelled task can be reopened.
    #[error("task is {0}: only a failed or cancelled task can be reopened")]
    NotTerminal(Status),
    /// A [reopening](TaskStore::reopen) of a task whose request key names
    /// newer work now (its dedup record expired and a new submission took
    /// the key): reopening would give one key two live tasks. Only a store
    /// whose dedup records expire apart from the task (DynamoDB) answers it;
    /// in PostgreSQL and memory the key stays with its task until a purge.
    #[error("the request key now names task {current}: this task cannot be reopened")]
    KeyReused {
        /// The task the key names now.
        current: TaskId,
    },
}

impl Rejection {
    /// A short, stable name of the variant (`already_completed`,
    /// `superseded`, `lease_expired`, `not_running`, `not_terminal`,
    /// `key_reused`): the `reason` label of the metrics, and a field for logs.
    ///
    /// ```
    /// assert_eq!(taskfence::Rejection::LeaseExpired.label(), "lease_expired");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::AlreadyCompleted(_) => "already_completed",
            Rejection::Superseded { .. } => "superseded",
            Rejection::LeaseExpired => "lease_expired",
            Rejection::NotRunning(_) => "not_running",
            Rejection::NotTerminal(_) => "not_terminal",
            Rejection::KeyReused { .. } => "key_reused",
        }
    }
}

/// The outcome of a fenced write: accepted, or rejected with the reason.
///
/// ```
/// use taskfence::{Fenced, Rejection};
/// let ok: Fenced<u8> = Fenced::Accepted(1);
/// assert_eq!(ok.accepted(), Some(1));
/// let no: Fenced<u8> = Fenced::Rejected(Rejection::LeaseExpired);
/// assert_eq!(no.rejection(), Some(&Rejection::LeaseExpired));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rejected write must be handled: the worker no longer holds the task"]
pub enum Fenced<T> {
    /// The write happened.
    Accepted(T),
    /// The write was refused; nothing changed.
    Rejected(Rejection),
}

impl<T> Fenced<T> {
    /// `true` for [`Fenced::Accepted`].
    pub fn is_accepted(&self) -> bool {
        matches!(self, Fenced::Accepted(_))
    }
    /// The accepted value, if any.
    pub fn accepted(self) -> Option<T> {
        match self {
            Fenced::Accepted(v) => Some(v),
            Fenced::Rejected(_) => None,
        }
    }
    /// The rejection, if any.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Fenced::Accepted(_) => None,
            Fenced::Rejected(r) => Some(r),
        }
    }
    /// Converts into a standard `Result`.
    pub fn into_result(self) -> std::result::Result<T, Rejection> {
        match self {
            Fenced::Accepted(v) => Ok(v),
            Fenced::Rejected(r) => Err(r),
        }
    }
    /// Maps the accepted value; a rejection stays as it is.
    ///
    /// ```
    /// use taskfence::Fenced;
    /// let saved: Fenced<u32> = Fenced::Accepted(2);
    /// assert_eq!(saved.map(|n| n * 10).accepted(), Some(20));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Accepted(v) => Fenced::Accepted(f(v)),
            Fenced::Rejected(r) => Fenced::Rejected(r),
        }
    }
}

/// What an accepted [`TaskStore::fail`] led to.
///
/// ```
/// # fn f(r: taskfence::Retry) {
/// match r {
///     taskfence::Retry::Scheduled { not_before, attempts_left } => {}
///     taskfence::Retry::Exhausted(task) => {}
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Another attempt may claim the task at or after `not_before`.
    Scheduled {
        /// Earliest next claim (store clock).
        not_before: OffsetDateTime,
        /// Claims still allowed.
        attempts_left: u32,
    },
    /// No retry: the task is terminally `Failed` (permanent failure, ambiguous
    /// with [`OnAmbiguous::Stop`](crate::policy::OnAmbiguous::Stop), attempts or deadline exhausted).
    Exhausted(Box<Task>),
}
