//! What the store records of a task's past: each claim (attempt) and how it
//! ended, each reopening.

use time::OffsetDateTime;

#[cfg(doc)]
use super::TaskStore;
use crate::policy::FailureKind;
use crate::task::{AttemptId, Status, TaskId};

/// One [`TaskStore::reopen`] of a task, as its story records it.
///
/// ```
/// # fn f(r: taskfence::store::Reopening) {
/// println!("reopened #{} by {} at version {}: {}", r.number, r.by, r.version, r.reason);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Reopening {
    /// The task.
    pub task_id: TaskId,
    /// 1-based: the task's first, second… reopening.
    pub number: u32,
    /// When (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub at: OffsetDateTime,
    /// Who asked.
    pub by: String,
    /// Why.
    pub reason: String,
    /// The status it was reopened from (failed or cancelled).
    pub from: Status,
    /// The assignment version then: the new budget's base.
    pub version: u64,
}

impl Reopening {
    /// The `number`th reopening of `task_id` (a backend's record): at `at`,
    /// by `by` for `reason`, from status `from` at assignment version `version`.
    ///
    /// ```
    /// use taskfence::store::Reopening;
    /// let r = Reopening::new(taskfence::TaskId::new(), 1, time::OffsetDateTime::now_utc(), "ops", "fixed", taskfence::Status::Failed, 3);
    /// assert_eq!(r.number, 1);
    /// ```
    pub fn new(
        task_id: TaskId,
        number: u32,
        at: OffsetDateTime,
        by: impl Into<String>,
        reason: impl Into<String>,
        from: Status,
        version: u64,
    ) -> Self {
        Self {
            task_id,
            number,
            at,
            by: by.into(),
            reason: reason.into(),
            from,
            version,
        }
    }
}

/// How an attempt ended.
///
/// Non-exhaustive: a later release may record a new way for an attempt to
/// end, so a `match` needs a wildcard arm.
///
/// ```
/// use taskfence::store::AttemptOutcome;
/// assert_eq!(AttemptOutcome::Expired.as_str(), "expired");
/// assert!(!AttemptOutcome::ReturnedUnstarted.counts());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Still holding (or last held) the lease; no outcome reported.
    Running,
    /// Its response was saved.
    Completed,
    /// It reported a failure of this kind.
    Failed(FailureKind),
    /// It gave the task back after its work began
    /// ([`release`](crate::TaskStore::release)): the attempt counts.
    Released,
    /// It gave the task back before its work began
    /// ([`release_unstarted`](crate::TaskStore::release_unstarted), a
    /// prefetched claim at a stop): the claim was refunded to the retry
    /// budget.
    ReturnedUnstarted,
    /// Its lease expired without a report; the task was taken over or its budget ran out.
    Expired,
    /// The task was cancelled while it ran.
    Cancelled,
    /// It still held the lease when an earlier attempt's answer was saved
    /// (only under [`AcceptanceRule::FirstValidAnswer`](crate::policy::AcceptanceRule::FirstValidAnswer)).
    Overtaken,
}

impl AttemptOutcome {
    /// The lowercase name used in storage and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Failed(FailureKind::Retryable) => "failed_retryable",
            AttemptOutcome::Failed(FailureKind::Permanent) => "failed_permanent",
            AttemptOutcome::Failed(FailureKind::Ambiguous) => "failed_ambiguous",
            AttemptOutcome::Released => "released",
            AttemptOutcome::ReturnedUnstarted => "returned_unstarted",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::Overtaken => "overtaken",
        }
    }

    /// Whether an attempt that ended so counts against the retry budget:
    /// every outcome but [`ReturnedUnstarted`](Self::ReturnedUnstarted)
    /// (work began, or the lease was held until it was lost).
    ///
    /// ```
    /// use taskfence::store::AttemptOutcome;
    /// assert!(AttemptOutcome::Expired.counts(), "a crash is an attempt");
    /// assert!(AttemptOutcome::Released.counts());
    /// ```
    pub const fn counts(self) -> bool {
        !matches!(self, AttemptOutcome::ReturnedUnstarted)
    }

    /// Parses [`as_str`](Self::as_str)'s output.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => AttemptOutcome::Running,
            "completed" => AttemptOutcome::Completed,
            "failed_retryable" => AttemptOutcome::Failed(FailureKind::Retryable),
            "failed_permanent" => AttemptOutcome::Failed(FailureKind::Permanent),
            "failed_ambiguous" => AttemptOutcome::Failed(FailureKind::Ambiguous),
            "released" => AttemptOutcome::Released,
            "returned_unstarted" => AttemptOutcome::ReturnedUnstarted,
            "expired" => AttemptOutcome::Expired,
            "cancelled" => AttemptOutcome::Cancelled,
            "overtaken" => AttemptOutcome::Overtaken,
            _ => return None,
        })
    }
}

/// One claim of a task, as [`TaskStore::attempts`] reports it.
///
/// ```
/// # fn f(a: taskfence::store::Attempt) {
/// println!("attempt {} by {}: {:?}", a.number, a.worker, a.outcome);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt's id.
    pub id: AttemptId,
    /// The task.
    pub task_id: TaskId,
    /// 1-based attempt number, equal to the assignment version it held.
    pub number: u32,
    /// The worker that claimed it.
    pub worker: String,
    /// When it was claimed (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub started_at: OffsetDateTime,
    /// When it ended, if it has.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub finished_at: Option<OffsetDateTime>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The provider operation id it recorded, if any.
    pub operation_id: Option<String>,
    /// The failure message it reported, if any.
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt as its claim starts it: running, nothing recorded yet (a
    /// backend's record; it sets the other fields as the attempt goes on).
    ///
    /// ```
    /// use taskfence::store::{Attempt, AttemptOutcome};
    /// use taskfence::task::AttemptId;
    /// let a = Attempt::started(AttemptId::new(), taskfence::TaskId::new(), 1, "w", time::OffsetDateTime::now_utc());
    /// assert_eq!(a.outcome, AttemptOutcome::Running);
    /// ```
    pub fn started(
        id: AttemptId,
        task_id: TaskId,
        number: u32,
        worker: impl Into<String>,
        started_at: OffsetDateTime,
    ) -> Self {
        Self {
            id,
            task_id,
            number,
            worker: worker.into(),
            started_at,
            finished_at: None,
            outcome: AttemptOutcome::Running,
            operation_id: None,
            error: None,
        }
    }
}
