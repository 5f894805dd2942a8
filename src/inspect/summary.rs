//! [`TaskSummary`]: a task as a listing shows it — everything but its
//! payload and its response, which may each be up to a mebibyte and which a
//! page of a thousand rows must never load.

use time::OffsetDateTime;

use crate::policy::{AcceptanceRule, RetryPolicy};
use crate::task::{InputHash, RequestKey, Response, Status, Task, TaskId, budget};
use crate::throttle::TaskLimits;
use crate::trace::TraceContext;

/// One row of [`Inspect::list`](super::Inspect::list): a [`Task`] without
/// its `payload` and `response`, so a page costs the same whatever the
/// tasks carry. [`TaskStore::get`](crate::TaskStore::get) or
/// [`Inspect::story`](super::Inspect::story) reads one task whole.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::inspect::{Inspect, TaskQuery};
/// use taskfence::*;
/// let store = MemoryStore::new();
/// let big = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["k"])).payload(vec![0; 1 << 20]);
/// let id = store.submit(big).await?.into_task().id;
/// let row = &store.list(&TaskQuery::new()).await?.tasks[0];
/// assert_eq!((row.id, row.status), (id, Status::Pending)); // no payload to load
/// assert_eq!(store.get(id).await?.unwrap().payload.len(), 1 << 20);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct TaskSummary {
    /// Stable identity.
    pub id: TaskId,
    /// The request key.
    pub key: RequestKey,
    /// The fingerprint of the inputs.
    pub input_hash: InputHash,
    /// The status.
    pub status: Status,
    /// The assignment version (the number of claims so far).
    pub version: u64,
    /// The retry policy.
    pub policy: RetryPolicy,
    /// The version the current retry budget started at.
    pub budget_base: u64,
    /// When the current retry budget started (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub budget_started_at: OffsetDateTime,
    /// Which completions are accepted.
    pub acceptance: AcceptanceRule,
    /// Lease expiry, while running.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub lease_until: Option<OffsetDateTime>,
    /// Not claimable before this instant (backoff).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub not_before: Option<OffsetDateTime>,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// When it was submitted (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub created_at: OffsetDateTime,
    /// When it reached a terminal status.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub finished_at: Option<OffsetDateTime>,
    /// When it may be purged.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub expires_at: OffsetDateTime,
    /// The submitting span's trace context, if any.
    #[cfg_attr(feature = "serde", serde(default))]
    pub trace_context: Option<TraceContext>,
    /// The concurrency key and rate bucket its claims are subject to.
    #[cfg_attr(feature = "serde", serde(default))]
    pub limits: TaskLimits,
}

impl TaskSummary {
    /// Attempts made so far, as [`Task::attempts`].
    ///
    /// ```
    /// # fn f(row: taskfence::inspect::TaskSummary) { let _ = row.attempts(); }
    /// ```
    pub fn attempts(&self) -> u32 {
        budget::attempts(self.version)
    }

    /// Attempts made in the current retry budget, as [`Task::attempts_in_budget`].
    ///
    /// ```
    /// # fn f(row: taskfence::inspect::TaskSummary) { let _ = row.attempts_in_budget(); }
    /// ```
    pub fn attempts_in_budget(&self) -> u32 {
        budget::attempts_in_budget(self.version, self.budget_base)
    }

    /// Attempts still allowed in the current budget, as [`Task::attempts_left`].
    ///
    /// ```
    /// # fn f(row: taskfence::inspect::TaskSummary) { let _ = row.attempts_left(); }
    /// ```
    pub fn attempts_left(&self) -> u32 {
        budget::attempts_left(&self.policy, self.version, self.budget_base)
    }

    /// The elapsed-time deadline, if the policy has one, as [`Task::deadline_at`].
    ///
    /// ```
    /// # fn f(row: taskfence::inspect::TaskSummary) { let _ = row.deadline_at(); }
    /// ```
    pub fn deadline_at(&self) -> Option<OffsetDateTime> {
        budget::deadline_at(&self.policy, self.budget_started_at)
    }
}

impl TaskSummary {
    /// The whole task: this summary with its payload and response (a backend
    /// that decodes both from one row).
    #[cfg_attr(not(any(feature = "postgres", feature = "dynamodb")), allow(dead_code))]
    pub(crate) fn into_task(self, payload: Vec<u8>, response: Option<Response>) -> Task {
        Task {
            id: self.id,
            key: self.key,
            input_hash: self.input_hash,
            payload,
            status: self.status,
            version: self.version,
            policy: self.policy,
            budget_base: self.budget_base,
            budget_started_at: self.budget_started_at,
            acceptance: self.acceptance,
            lease_until: self.lease_until,
            not_before: self.not_before,
            response,
            last_error: self.last_error,
            created_at: self.created_at,
            finished_at: self.finished_at,
            expires_at: self.expires_at,
            trace_context: self.trace_context,
            limits: self.limits,
        }
    }
}

impl From<Task> for TaskSummary {
    /// Drops the payload and the response.
    fn from(task: Task) -> Self {
        Self::from(&task)
    }
}

impl From<&Task> for TaskSummary {
    /// Copies everything but the payload and the response.
    fn from(task: &Task) -> Self {
        Self {
            id: task.id,
            key: task.key.clone(),
            input_hash: task.input_hash,
            status: task.status,
            version: task.version,
            policy: task.policy,
            budget_base: task.budget_base,
            budget_started_at: task.budget_started_at,
            acceptance: task.acceptance,
            lease_until: task.lease_until,
            not_before: task.not_before,
            last_error: task.last_error.clone(),
            created_at: task.created_at,
            finished_at: task.finished_at,
            expires_at: task.expires_at,
            trace_context: task.trace_context.clone(),
            limits: task.limits.clone(),
        }
    }
}
