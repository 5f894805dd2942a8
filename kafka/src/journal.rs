//! What a reply consumer did, as events: a record produced, a partition
//! assigned (with the committed offset read at that moment), a record
//! received and durably handled, a provider call, an offset commit, a lease
//! released at shutdown. A [`Journal`] receives them; [`TracingJournal`], the
//! production one, logs them. The tests keep them in order and check the
//! commit discipline over them (`sim::journal`, not part of the template).

use taskfence::TaskId;

/// How a record ended for the consumer that handled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Handled {
    /// This consumer's attempt saved the task's response.
    Completed,
    /// The task was already completed: skipped without calling the provider.
    AlreadyCompleted,
    /// Another attempt saved the response while this one worked.
    CompletedElsewhere,
    /// The task is terminally failed (now or before).
    Failed,
    /// The task was cancelled, or is unknown to the store (purged).
    Dropped,
    /// The record carried no task id: nothing to do.
    Malformed,
}

/// One step of a run. `consumer` names the consumer (its worker id).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The dispatcher's record was acknowledged by the broker at this offset.
    Produced {
        /// Partition the record landed in.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// The task it hands off.
        task: TaskId,
    },
    /// The group gave `partition` to `consumer`; `committed` is the group's
    /// committed offset read from the broker at that moment (`None`: none yet).
    Assigned {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// The committed offset the consumer resumes from.
        committed: Option<i64>,
    },
    /// The group took `partition` away from `consumer`.
    Revoked {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
    },
    /// A record reached the consumer.
    Received {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The task it names (`None`: malformed).
        task: Option<TaskId>,
    },
    /// The record's task is durably settled; the record may be committed past.
    Finished {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The task (`None`: malformed).
        task: Option<TaskId>,
        /// How.
        handled: Handled,
    },
    /// The provider was called for this task (at the start of the call).
    ProviderCall {
        /// Worker that called.
        worker: String,
        /// Task.
        task: TaskId,
        /// The attempt's assignment version.
        version: u64,
    },
    /// A commit of `offset` (the next record to read) was issued for `partition`.
    Commit {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// The committed position.
        offset: i64,
        /// PostgreSQL position mode: the record whose completion was saved in
        /// the same transaction as this position (so it need not be finished before).
        with: Option<i64>,
    },
    /// The broker answered a commit.
    CommitResult {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// The position.
        offset: i64,
        /// `true` if the broker accepted it.
        ok: bool,
    },
    /// Shutdown: the consumer gave the task back (`TaskStore::release`: its
    /// work outlived the grace, or had not started); the record stays
    /// unfinished and the next owner re-reads it.
    Released {
        /// Consumer.
        consumer: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The task.
        task: TaskId,
        /// `true` if the store accepted the release: the task is pending
        /// again, claimable at once. `false` if it refused it (the lease was
        /// superseded or had expired) or did not answer: the task stays as it
        /// is and a lease still held runs out on its own.
        accepted: bool,
        /// Why it was not accepted: the store's rejection or error (`None`
        /// when accepted).
        refusal: Option<String>,
    },
    /// A consumer was killed: it stopped at once and committed nothing more.
    Killed {
        /// Consumer.
        consumer: String,
    },
}

/// Receives the events of a run. Implementations must be cheap and must not block.
pub trait Journal: Send + Sync {
    /// Records one event.
    fn record(&self, event: Event);
}

/// Logs every event at `debug` level (commits, assignments and releases at `info`): the production journal.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingJournal;

impl Journal for TracingJournal {
    fn record(&self, event: Event) {
        match &event {
            Event::Commit { .. }
            | Event::Assigned { .. }
            | Event::Revoked { .. }
            | Event::Released { .. } => {
                tracing::info!(?event);
            }
            _ => tracing::debug!(?event),
        }
    }
}
