//! [`Group`]: group commit. The writes this process makes through one
//! [`SqliteStore`] at the same moment share one `BEGIN IMMEDIATE`
//! transaction and one commit, instead of taking the file's write lock
//! and flushing the WAL one after another.
//!
//! SQLite writes one transaction at a time, and with `synchronous = FULL`
//! each commit waits for the disk. Writers of one process already queue for
//! the lock; group commit lets the queue share the cost:
//!
//! - The first writer to find no batch open begins one (`BEGIN IMMEDIATE`,
//!   the write lock before anything is read). Each writer then runs its
//!   whole operation alone — reads, decision, writes — as a savepoint of
//!   the batch, in turn: the decisions are exactly those of one
//!   transaction per operation run in that order.
//! - An operation that fails is rolled back to its savepoint and answers at
//!   once: nothing of it stays, and its batch goes on.
//! - The writer that finds nobody queued behind it (or the batch at
//!   [`MAX_WRITES`]) commits. Everyone else in the batch waits for that
//!   commit, and only then answers: no caller hears "claimed" or "saved"
//!   before the write is on disk. A failed commit fails every write in the
//!   batch (none of it was written); a busy file is tried again like any
//!   busy write.
//! - A writer dropped mid-operation (its future cancelled) ends its batch
//!   unwritten: what it wrote so far cannot be told apart from the others'
//!   writes, so the batch's transaction is rolled back whole, and each
//!   writer waiting for that batch tries its whole operation again (within
//!   its busy budget). A batch whose committing writer was cancelled between
//!   operations is committed by the next writer to arrive or by a waiting
//!   one after [`STALE_AFTER`], so the write lock is never left held by a
//!   batch nobody finishes.
//! - Each operation's savepoint is a plain `SAVEPOINT` statement, not a
//!   nested sqlx transaction: one of those dropped while its `SAVEPOINT` is
//!   on its way to the connection is rolled back twice, the second time
//!   taking the batch's transaction with it, and the batch's commit would
//!   then commit nothing while answering success.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::{Sqlite, SqliteConnection, Transaction};
use tokio::sync::{Mutex, MutexGuard, watch};

use crate::error::{Error, Result};

use super::{SqliteStore, db};

/// The most writes one commit carries, so a steady stream of writers still
/// commits (and answers) regularly.
pub(crate) const MAX_WRITES: usize = 64;

/// How long a write waits for its batch's commit before it checks whether
/// the batch was left open by a cancelled writer.
pub(crate) const STALE_AFTER: Duration = Duration::from_millis(5);

/// The batch this process's writers share, and how many are queued for it.
#[derive(Default)]
pub(crate) struct Group {
    slot: Mutex<Slot>,
    /// Writers waiting for the slot: the writer holding it commits when none is.
    queued: AtomicUsize,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(crate) struct Slot {
    open: Option<Batch>,
    /// The number the next batch gets.
    next: u64,
}

/// One open transaction and the writes made in it so far.
struct Batch {
    number: u64,
    tx: Transaction<'static, Sqlite>,
    writes: usize,
    /// An operation's savepoint may be open (not yet released or rolled back).
    in_operation: bool,
    /// `Some(outcome)` once committed (or failed): what each writer answers.
    done: watch::Sender<Option<Outcome>>,
}

/// How a batch ended: every write in it shares the answer.
#[derive(Clone)]
enum Outcome {
    Committed,
    Failed(Arc<Error>),
}

impl Group {
    /// Waits for this process's turn to write, in the open batch or a new
    /// one (`BEGIN IMMEDIATE`; [`Error::Busy`] when another process holds
    /// the file's lock past `busy_timeout`, for the caller to try again).
    pub(crate) async fn join<'g>(self: &'g Arc<Self>, store: &SqliteStore) -> Result<Write<'g>> {
        let slot = {
            let _queued = Queued::new(&self.queued);
            self.slot.lock().await
        };
        let mut write = Write {
            group: self,
            slot,
            finished: false,
        };
        if write.slot.open.is_none() {
            store.ensure_schema().await?;
            let tx = store.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
            let number = write.slot.next;
            write.slot.next += 1;
            write.slot.open = Some(Batch {
                number,
                tx,
                writes: 0,
                in_operation: false,
                done: watch::channel(None).0,
            });
        }
        Ok(write)
    }

    /// The slot with no batch open (one left open is committed first): for
    /// work that takes the file's write lock on its own, as the migrations do.
    pub(crate) async fn exclusive(&self) -> Result<MutexGuard<'_, Slot>> {
        let mut slot = self.slot.lock().await;
        if let Some(batch) = slot.open.take() {
            batch.commit().await?;
        }
        Ok(slot)
    }

    /// Waits until batch `number` ends, and answers as it ended. Past
    /// [`STALE_AFTER`] without an answer, commits the batch if it is still
    /// open and nobody is queued to do it (its last writer was cancelled).
    async fn outcome(
        self: &Arc<Self>,
        number: u64,
        mut done: watch::Receiver<Option<Outcome>>,
    ) -> Result<()> {
        let mut watching = Watching {
            group: self,
            number,
            armed: true,
        };
        loop {
            if let Some(outcome) = done.borrow_and_update().clone() {
                watching.armed = false;
                return outcome.answer();
            }
            match tokio::time::timeout(STALE_AFTER, done.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    watching.armed = false;
                    return Err(abandoned());
                }
                Err(_) => self.commit_if_left(number).await,
            }
        }
    }

    /// Commits batch `number` if it is still open with nobody queued.
    async fn commit_if_left(&self, number: u64) {
        let mut slot = self.slot.lock().await;
        let left = slot.open.as_ref().is_some_and(|b| b.number == number);
        if left
            && self.queued.load(Ordering::SeqCst) == 0
            && let Some(batch) = slot.open.take()
        {
            // Its writers hear the outcome through the batch's channel.
            let _ = batch.commit().await;
        }
    }
}

impl Batch {
    /// Commits (or, holding no write, rolls back) and tells every writer.
    async fn commit(self) -> Result<()> {
        let result = if self.writes == 0 {
            self.tx.rollback().await
        } else {
            self.tx.commit().await
        }
        .map_err(db);
        let (outcome, answer) = match result {
            Ok(()) => (Outcome::Committed, Ok(())),
            Err(e) => {
                let shared = Arc::new(e);
                (Outcome::Failed(shared.clone()), Err(echo(&shared)))
            }
        };
        self.done.send_replace(Some(outcome));
        answer
    }

    /// Ends the batch without writing any of it, telling every writer why.
    async fn abort(self, why: Error) {
        let _ = self.tx.rollback().await;
        self.done.send_replace(Some(Outcome::Failed(Arc::new(why))));
    }
}

impl Outcome {
    fn answer(self) -> Result<()> {
        match self {
            Self::Committed => Ok(()),
            Self::Failed(e) => Err(echo(&e)),
        }
    }
}

/// A writer's turn: the slot held, a batch open.
pub(crate) struct Write<'g> {
    group: &'g Arc<Group>,
    slot: MutexGuard<'g, Slot>,
    finished: bool,
}

/// The savepoint each operation runs in. Plain statements, not a nested
/// sqlx transaction: a nested one dropped while its `SAVEPOINT` is on its
/// way is rolled back twice, the second time taking the batch's own
/// transaction with it. A writer dropped mid-operation ends the batch
/// instead (see [`Write`]'s `Drop`).
const SAVEPOINT: &str = "SAVEPOINT taskfence_write";
const RELEASE: &str = "RELEASE taskfence_write";
const ROLLBACK_TO: &str = "ROLLBACK TO taskfence_write; RELEASE taskfence_write";

impl Write<'_> {
    /// Opens the operation's savepoint in the batch; its connection.
    pub(crate) async fn savepoint(&mut self) -> Result<&mut SqliteConnection> {
        let batch = self.slot.open.as_mut().expect("a write's batch is open");
        // From here until it is settled, a drop of this writer ends the batch.
        batch.in_operation = true;
        sqlx::raw_sql(SAVEPOINT)
            .execute(&mut *batch.tx)
            .await
            .map_err(db)?;
        Ok(&mut *batch.tx)
    }

    /// Ends the operation's savepoint as its answer says: released when it
    /// succeeded, rolled back when it failed. The flag is false when that
    /// could not be done (the batch is then ended unwritten).
    pub(crate) async fn settle<T>(&mut self, answer: Result<T>) -> (Result<T>, bool) {
        let batch = self.slot.open.as_mut().expect("a write's batch is open");
        let (answer, end) = match answer {
            Ok(value) => match sqlx::raw_sql(RELEASE).execute(&mut *batch.tx).await {
                Ok(_) => (Ok(value), true),
                Err(e) => (Err(db(e)), false),
            },
            Err(e) => (
                Err(e),
                sqlx::raw_sql(ROLLBACK_TO).execute(&mut *batch.tx).await.is_ok(),
            ),
        };
        if end {
            batch.in_operation = false;
        }
        (answer, end)
    }

    /// The operation's answer once it stands: a failure at once (its
    /// savepoint was rolled back), a success once the batch committed.
    /// `clean` is false when the operation's savepoint could not be ended:
    /// the batch is then ended unwritten.
    pub(crate) async fn finish<T>(mut self, answer: Result<T>, clean: bool) -> Result<T> {
        self.finished = true;
        let mut batch = self.slot.open.take().expect("a write's batch is open");
        if !clean || batch.in_operation {
            batch.abort(abandoned()).await;
            return answer.and(Err(abandoned()));
        }
        if answer.is_ok() {
            batch.writes += 1;
        }
        let last = self.group.queued.load(Ordering::SeqCst) == 0 || batch.writes >= MAX_WRITES;
        if last {
            // In a task of its own: a writer cancelled now must not leave its
            // batch-mates an unknown outcome for a commit that may have happened.
            let committed = tokio::spawn(batch.commit())
                .await
                .unwrap_or_else(|_| Err(abandoned()));
            return match (answer, committed) {
                (Ok(_), Err(e)) => Err(e),
                (answer, _) => answer,
            };
        }
        let (number, done) = (batch.number, batch.done.subscribe());
        self.slot.open = Some(batch);
        let value = answer?;
        let group = self.group;
        drop(self); // the slot, for the next writer of the batch
        group.outcome(number, done).await.map(|()| value)
    }
}

impl Drop for Write<'_> {
    /// A writer dropped before it finished. Mid-operation, what it wrote
    /// cannot be told apart from the batch's other writes: the batch is
    /// ended unwritten (its transaction rolled back as it is dropped), and
    /// its waiting writers hear so and try again. Between operations, a
    /// batch with no write in it is ended the same way (nobody waits for it).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let end = self
            .slot
            .open
            .as_ref()
            .is_some_and(|b| b.in_operation || b.writes == 0);
        if end {
            // Dropping the transaction rolls it back and frees the lock;
            // dropping its channel tells its writers.
            self.slot.open = None;
        }
    }
}

/// Counts a writer queued for the slot while it waits (and stops counting
/// it if it is cancelled meanwhile).
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A writer waiting for its batch's commit. If it is cancelled, the check
/// it would have made runs on its own, so a batch whose writers all left
/// is still committed.
struct Watching<'a> {
    group: &'a Arc<Group>,
    number: u64,
    armed: bool,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (group, number) = (self.group.clone(), self.number);
            runtime.spawn(async move {
                tokio::time::sleep(STALE_AFTER).await;
                group.commit_if_left(number).await;
            });
        }
    }
}

/// A batch ended before it committed (a writer's savepoint could not be
/// ended, or a writer was dropped mid-operation): none of its writes were
/// made, and each of its writers tries its whole operation again.
fn abandoned() -> Error {
    Error::storage(BatchError::Abandoned)
}

/// Whether `e` says the write's batch was ended unwritten: its operation
/// may be tried again from the start.
pub(crate) fn is_abandoned(e: &Error) -> bool {
    matches!(e, Error::Storage(source) if matches!(source.downcast_ref::<BatchError>(), Some(BatchError::Abandoned)))
}

/// One writer's copy of the batch's failure.
fn echo(e: &Arc<Error>) -> Error {
    if is_abandoned(e) {
        return abandoned();
    }
    match &**e {
        Error::Busy { waited } => Error::Busy { waited: *waited },
        Error::Unwritable { detail } => Error::Unwritable {
            detail: detail.clone(),
        },
        _ => Error::storage(BatchError::Commit(e.clone())),
    }
}

/// Why a group commit failed, as each of its writers sees it.
#[derive(Debug)]
enum BatchError {
    Abandoned,
    Commit(Arc<Error>),
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Abandoned => {
                f.write_str("the write's batch was rolled back before its commit; nothing of it was written")
            }
            Self::Commit(e) => write!(
                f,
                "the commit of the write's batch failed; nothing of it was written: {e}"
            ),
        }
    }
}

impl std::error::Error for BatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Abandoned => None,
            Self::Commit(e) => Some(&**e),
        }
    }
}
