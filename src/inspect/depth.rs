//! [`QueueDepth`]: one operation's queue — the tasks waiting for a worker,
//! those waiting for their time, those running — read from the live tasks
//! only, so its cost grows with the backlog and never with retained history.

use std::collections::BTreeMap;
use std::time::Duration;

use time::OffsetDateTime;

use super::TaskSummary;
use crate::backend::rules;
use crate::task::Status;

/// One operation's queue, as [`Inspect::depth`](super::Inspect::depth)
/// reports it: what an autoscaler or an alert reads ("due" is the work no
/// worker has taken yet; its oldest is the pickup lag).
///
/// Counted from the pending and running tasks alone: finished tasks kept for
/// their retention window are never read, however many there are.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
/// use taskfence::inspect::Inspect;
/// use taskfence::*;
/// let store = MemoryStore::new();
/// store.submit(NewTask::new(RequestKey::new("u", "email.send", "k1"), InputHash::of(["k1"]))).await?;
/// let queues = store.depth().await?;
/// assert_eq!((queues[0].operation.as_str(), queues[0].due, queues[0].running), ("email.send", 1, 0));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct QueueDepth {
    /// The tasks' operation.
    pub operation: String,
    /// Tasks a worker would claim now ([`rules::due_since`]): pending and
    /// due (never claimed, released, or past a retry's backoff), or running
    /// with an expired lease.
    pub due: u64,
    /// Pending tasks not due yet: backing off before a retry.
    pub scheduled: u64,
    /// Running tasks whose lease is live.
    pub running: u64,
    /// Since when the longest-waiting due task has been due; `None` when
    /// none is. [`oldest_wait`](Self::oldest_wait) is the pickup lag.
    pub oldest_due_at: Option<OffsetDateTime>,
}

impl QueueDepth {
    /// An operation's empty queue.
    ///
    /// ```
    /// let empty = taskfence::inspect::QueueDepth::new("email.send");
    /// assert_eq!((empty.due, empty.scheduled, empty.running), (0, 0, 0));
    /// ```
    pub fn new(operation: impl Into<String>) -> Self {
        Self {
            operation: operation.into(),
            due: 0,
            scheduled: 0,
            running: 0,
            oldest_due_at: None,
        }
    }

    /// The queues of `tasks` at `now`, by operation (in operation order), one
    /// per operation with a pending or running task: the count every
    /// backend's [`Inspect::depth`](super::Inspect::depth) equals.
    ///
    /// ```
    /// use taskfence::inspect::QueueDepth;
    /// let none = QueueDepth::tally(&[], time::OffsetDateTime::now_utc());
    /// assert!(none.is_empty());
    /// ```
    pub fn tally<'a>(tasks: impl IntoIterator<Item = &'a TaskSummary>, now: OffsetDateTime) -> Vec<Self> {
        let mut queues: BTreeMap<&str, Self> = BTreeMap::new();
        for task in tasks {
            if !matches!(task.status, Status::Pending | Status::Running) {
                continue;
            }
            let operation = task.key.operation.as_str();
            let queue = queues.entry(operation).or_insert_with(|| Self::new(operation));
            match rules::summary_due_since(task, now) {
                Some(since) => {
                    queue.due += 1;
                    queue.oldest_due_at = Some(queue.oldest_due_at.map_or(since, |oldest| oldest.min(since)));
                }
                None if task.status == Status::Pending => queue.scheduled += 1,
                None => queue.running += 1,
            }
        }
        queues.into_values().collect()
    }

    /// How long the oldest due task has waited for a worker at `now` (zero
    /// for one due in the future of `now`, a clock skew); `None` when no
    /// task is due.
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskfence::inspect::QueueDepth;
    /// let now = time::OffsetDateTime::now_utc();
    /// let mut queue = QueueDepth::new("email.send");
    /// queue.oldest_due_at = Some(now - Duration::from_secs(3));
    /// assert_eq!(queue.oldest_wait(now), Some(Duration::from_secs(3)));
    /// ```
    pub fn oldest_wait(&self, now: OffsetDateTime) -> Option<Duration> {
        self.oldest_due_at
            .map(|since| Duration::try_from(now - since).unwrap_or(Duration::ZERO))
    }
}
