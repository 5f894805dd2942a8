//! [`Lease`]: one assignment's right to work on a task, the token every fenced
//! write presents.

use time::OffsetDateTime;

#[cfg(doc)]
use crate::store::TaskStore;
use crate::task::{AttemptId, Task, TaskId};

/// One assignment's right to work on a task: the fencing token (assignment
/// version) and the lease expiry. [`complete`](TaskStore::complete),
/// [`fail`](TaskStore::fail) and [`release`](TaskStore::release) consume it.
///
/// The expiry here is a *hint* for the worker (when to renew, when to give up):
/// the store decides with its own clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use std::time::Duration;
/// use taskfence::*;
/// let store = MemoryStore::new();
/// let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { panic!() };
/// assert_eq!(lease.task_id(), task.id);
/// assert_eq!(lease.version(), 1);
/// assert_eq!(lease.attempt(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    task: Task,
    attempt_id: AttemptId,
    worker: String,
    expires_at: OffsetDateTime,
}

impl Lease {
    /// Builds a lease ([`backend::new_lease`](crate::backend::new_lease)).
    pub(crate) fn new(task: Task, attempt_id: AttemptId, worker: String, expires_at: OffsetDateTime) -> Self {
        Self {
            task,
            attempt_id,
            worker,
            expires_at,
        }
    }

    /// The task as it was when claimed (payload, policy, attempts).
    pub fn task(&self) -> &Task {
        &self.task
    }
    /// The task, for a store that builds the completed task from it without a copy.
    #[cfg(feature = "postgres")]
    pub(crate) fn into_task(self) -> Task {
        self.task
    }
    /// The task's id.
    pub fn task_id(&self) -> TaskId {
        self.task.id
    }
    /// The assignment version: the fencing token this lease writes with.
    pub fn version(&self) -> u64 {
        self.task.version
    }
    /// The attempt number (1-based); every claim is one attempt, so it equals the version.
    pub fn attempt(&self) -> u32 {
        self.task.attempts()
    }
    /// This attempt's id, for tracing.
    pub fn attempt_id(&self) -> AttemptId {
        self.attempt_id
    }
    /// The worker that holds it.
    pub fn worker(&self) -> &str {
        &self.worker
    }
    /// When the lease expires, as last reported by the store.
    pub fn expires_at(&self) -> OffsetDateTime {
        self.expires_at
    }
    /// Records a new expiry after a successful renewal ([`backend::renewed`](crate::backend::renewed)).
    pub(crate) fn set_expires_at(&mut self, at: OffsetDateTime) {
        self.expires_at = at;
    }
}
