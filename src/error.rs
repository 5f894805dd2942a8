//! The crate's error type.

use std::time::Duration;

use crate::id::TaskId;

/// `Result` with this crate's [`Error`].
///
/// ```
/// fn lookup() -> taskfence::Result<()> { Ok(()) }
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a store operation.
///
/// Rejections of a fenced write (a stale or expired lease) are *not* errors:
/// they are the [`Rejection`](crate::Rejection) inside a
/// [`Fenced::Rejected`](crate::Fenced::Rejected) outcome, because a worker must
/// handle them as a normal part of the protocol.
///
/// ```
/// use taskfence::Error;
/// use taskfence::error::InvalidInput;
/// let err = Error::from(InvalidInput::Blank { field: "key" });
/// assert!(matches!(err, Error::InvalidInput(InvalidInput::Blank { field: "key" })));
/// assert!(!err.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request key is already bound to a task with other inputs. Nothing was written.
    #[error("request key already used with different inputs by task {existing}")]
    KeyConflict {
        /// The task the key is bound to.
        existing: TaskId,
    },
    /// The input breaks a documented limit. Nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// No task with this id exists in this store (never did, or was purged).
    #[error("task {0} not found")]
    NotFound(TaskId),
    /// The store's schema (PostgreSQL) or table (DynamoDB) is missing, or
    /// older than this library: nothing was done. `fix` names what to run
    /// (`PgStore::migrate`, or `taskfence migrate` from the command line).
    #[error("the taskfence store is missing or older than this library ({detail}): {fix}")]
    NotMigrated {
        /// What is missing or how old it is, naming the schema or table.
        detail: String,
        /// What to run.
        fix: &'static str,
    },
    /// One of the application's own writes that the call carried in the same
    /// transaction (DynamoDB's extra `TransactWriteItems`) was refused by its
    /// own condition: nothing of the call was written, and the same call is
    /// refused again. Downcast the detail to the backend's type (DynamoDB:
    /// [`ExtraRefused`](crate::dynamodb::ExtraRefused), with the item's index and image).
    #[error("{0}")]
    ItemRefused(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The migrations cannot be applied as recorded: an applied migration has
    /// changed since, or the store was migrated by a newer library. Retrying
    /// cannot help; nothing was applied.
    #[error("taskfence migrations: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A read ran longer than the store's read timeout and the server
    /// cancelled it (PostgreSQL: `PgStoreBuilder::read_timeout`).
    /// Nothing was written; narrow the query, or try again when the store is less busy.
    #[error("the read ran longer than its limit of {limit:?} and was cancelled")]
    ReadTimeout {
        /// The limit it ran into.
        limit: std::time::Duration,
    },
    /// The store stayed locked by another writer for longer than its busy
    /// budget (SQLite: [`SqliteStoreBuilder::busy_budget`](crate::sqlite::SqliteStoreBuilder::busy_budget)),
    /// so the write never began: nothing was written. Try again; if it
    /// keeps happening, some writer holds its transaction too long.
    #[error("the store was locked by another writer for longer than {waited:?}; nothing was written")]
    Busy {
        /// How long the call waited for the write lock in all.
        waited: std::time::Duration,
    },
    /// The store cannot be written: its file (or directory) is read-only,
    /// or its disk is full. The write was rolled back whole: nothing was
    /// written. Retrying helps only once the cause is fixed.
    #[error("the store cannot be written ({detail}); nothing was written")]
    Unwritable {
        /// What the storage engine said.
        detail: String,
    },
    /// The backend does not support this yet (concurrency keys and rate
    /// buckets on a backend that does not store them). Nothing was written.
    #[error("{what} is not supported by this store")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
    },
    /// The backend failed (connection lost, server restarted…). The operation
    /// may or may not have taken effect: read the task before deciding again.
    #[error("storage backend error: {0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps a backend error.
    pub fn storage(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Storage(Box::new(err))
    }

    /// Wraps a migration failure that retrying cannot mend.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn migration(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Migration(Box::new(err))
    }

    /// A short, stable name of the variant (`not_found`, `invalid_input`,
    /// `key_conflict`, `not_migrated`, `migration`, `item_refused`, `read_timeout`, `busy`, `unwritable`,
    /// `unsupported`, `storage`): the `reason`
    /// label of the metrics, and a field for logs.
    ///
    /// ```
    /// assert_eq!(taskfence::Error::NotFound(taskfence::TaskId::new()).label(), "not_found");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::InvalidInput(_) => "invalid_input",
            Self::KeyConflict { .. } => "key_conflict",
            Self::NotMigrated { .. } => "not_migrated",
            Self::Migration(_) => "migration",
            Self::ItemRefused(_) => "item_refused",
            Self::ReadTimeout { .. } => "read_timeout",
            Self::Busy { .. } => "busy",
            Self::Unwritable { .. } => "unwritable",
            Self::Unsupported { .. } => "unsupported",
            Self::Storage(_) => "storage",
        }
    }

    /// `true` when trying the same call again may succeed (a backend failure,
    /// a read that ran out of time on a busy store, a write lock held too long
    /// by another writer).
    /// Every deterministic refusal — bad input, a key bound to other inputs,
    /// an unknown task, a schema to migrate, the application's own condition —
    /// is `false`.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Storage(_) | Self::ReadTimeout { .. } | Self::Busy { .. }
        )
    }
}

/// Which limit an input broke. Every variant names the field.
///
/// ```
/// use std::time::Duration;
/// use taskfence::{InputHash, NewTask, RequestKey};
/// use taskfence::error::InvalidInput;
/// let task = NewTask::new(RequestKey::new("user", "op", "a\0b"), InputHash::of(["x"]));
/// assert_eq!(task.validate(), Err(InvalidInput::ControlCharacter { field: "key", code: 0 }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// Empty or only whitespace.
    #[error("{field} is empty or blank")]
    Blank {
        /// The field.
        field: &'static str,
    },
    /// Longer than the limit, in bytes.
    #[error("{field} is {len} bytes, more than the limit of {max}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Contains a control character (NUL included).
    #[error("{field} contains control character U+{code:04X}")]
    ControlCharacter {
        /// The field.
        field: &'static str,
        /// The character's code point.
        code: u32,
    },
    /// A zero duration where a positive one is required.
    #[error("{field} must be a positive duration")]
    ZeroDuration {
        /// The field.
        field: &'static str,
    },
    /// A duration beyond the limit.
    #[error("{field} of {value:?} exceeds the limit of {max:?}")]
    DurationTooLong {
        /// The field.
        field: &'static str,
        /// The value given.
        value: Duration,
        /// The limit.
        max: Duration,
    },
    /// A number outside its allowed range.
    #[error("{field} is {value}, outside {min}..={max}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// The value given, as text (integers and floats alike).
        value: String,
        /// Lowest allowed.
        min: String,
        /// Highest allowed.
        max: String,
    },
    /// Two settings contradict each other.
    #[error("{0}")]
    Inconsistent(&'static str),
    /// The same task twice in one batch: each task is decided once per call.
    #[error("task {task} appears more than once in the batch")]
    DuplicateInBatch {
        /// The repeated task.
        task: TaskId,
    },
    /// A character outside the field's allowed set.
    #[error("{field} may contain only {allowed}")]
    NotAllowed {
        /// The field.
        field: &'static str,
        /// The characters it allows.
        allowed: &'static str,
    },
    /// An effect's outcome recorded by an assignment that did not begin it
    /// ([`finish_effect`](crate::TaskStore::finish_effect) without
    /// [`begin_effect`](crate::TaskStore::begin_effect) under the same lease).
    #[error("effect {effect} was not begun by this assignment")]
    EffectNotBegun {
        /// The effect's name.
        effect: String,
    },
    /// A listing whose filters the store's indexes cannot serve examined
    /// this many index entries without filling its page (DynamoDB: the
    /// `status` index serves the status; scope, operation and submission
    /// window are filtered after the read). Narrow it: a status, a scope
    /// or window with more matches, a smaller page.
    #[error(
        "the filters matched too few of the {examined} index entries a listing may examine; narrow the query"
    )]
    TooBroad {
        /// How many index entries it examined.
        examined: usize,
    },
    /// The operation cannot run on a handle that carries the application's
    /// own writes in one atomic request (DynamoDB's
    /// `DynamoStore::with`): it is not one
    /// transaction the items could join, or the items were carried by an
    /// earlier write of the same handle. Nothing was written.
    #[error("{operation} cannot carry the application's transaction items: {why}")]
    CannotCarryItems {
        /// The operation refused.
        operation: &'static str,
        /// Why it cannot carry them.
        why: &'static str,
    },
    /// A task names a rate bucket the store has no definition of: define it
    /// first ([`TaskStore::define_bucket`](crate::TaskStore::define_bucket)).
    #[error("no rate bucket named {bucket} is defined")]
    UnknownBucket {
        /// The bucket's name.
        bucket: String,
    },
    /// Not a plain lowercase SQL identifier (`[a-z_][a-z0-9_]*`, at most 63 bytes),
    /// e.g. a PostgreSQL schema name: it is written into SQL, so it must need no quoting.
    #[error("{field} must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, at most 63 bytes)")]
    NotAnIdentifier {
        /// The field.
        field: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_backend_failure_is_retryable() {
        let refusal = || -> Box<dyn std::error::Error + Send + Sync> { "refused".into() };
        let deterministic = [
            Error::KeyConflict {
                existing: TaskId::new(),
            },
            Error::InvalidInput(InvalidInput::Blank { field: "key" }),
            Error::NotFound(TaskId::new()),
            Error::NotMigrated {
                detail: "relation \"taskfence.tasks\" does not exist".into(),
                fix: "migrate",
            },
            Error::Migration(refusal()),
            Error::ItemRefused(refusal()),
        ];
        for err in &deterministic {
            assert!(
                !err.is_retryable(),
                "{}: the same call is refused again",
                err.label()
            );
        }
        assert!(Error::Storage(refusal()).is_retryable());
    }
}
