//! [`SqliteConnStore`]: a [`SqliteStore`] whose statements run on the
//! caller's connection or transaction — a [`TaskStore`](crate::TaskStore)
//! and an [`Inspect`](crate::inspect::Inspect) like the store itself.

use std::fmt;
use std::sync::Arc;

use sqlx::SqliteConnection;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tracing::Instrument;

use crate::backend::entry;
use crate::error::Result;
use crate::limits;
use crate::store::{Fenced, Lease};
use crate::task::TaskId;

use super::group::Group;
use super::site::{Site, run};
use super::{SqliteStore, ops};

/// A [`SqliteStore`] on one connection of the caller's — typically a
/// transaction from [`SqliteStore::begin`] — made by [`SqliteStore::on`].
/// It is a [`TaskStore`](crate::TaskStore) and an
/// [`Inspect`](crate::inspect::Inspect) with every operation, and adds
/// [`fence`](Self::fence) and [`redispatch`](Self::redispatch). Every
/// operation checks its input like the pool path and runs the same code on
/// the caller's connection.
///
/// # Inside the caller's transaction
///
/// - **Each operation is a savepoint of the caller's transaction**: it
///   commits or rolls back with it, and an operation that fails (a storage
///   error) is undone alone, leaving the transaction usable. On a
///   connection in no transaction, each operation is a transaction of its
///   own (`BEGIN IMMEDIATE`).
/// - **Begin with the write lock.** SQLite has one writer at a time. A
///   transaction begun with a plain `BEGIN` takes the lock at its first
///   write, and fails there with [`Error::Busy`](crate::Error::Busy) if
///   another writer committed since it began reading; the store cannot try
///   the caller's transaction again. [`SqliteStore::begin`] begins with
///   `BEGIN IMMEDIATE`, so nothing in it can be refused as busy.
/// - **Nothing else writes until it ends**: other writers (this process's
///   and other processes') wait for the commit or rollback, up to their busy
///   budget. Keep such transactions short; never hold one across a provider call.
/// - **Leases run on the store's clock, per operation.** A lease claimed or
///   renewed here starts when the operation runs; time the transaction
///   spends before its commit is taken from it. A write accepted here under
///   a lease that then expires before the commit still commits: no takeover
///   can run until then, and it then sees the written row.
/// - **A rollback undoes every write made through the handle**: submitted
///   tasks and their handoffs, claims (a lease from a rolled-back claim
///   names an assignment that no longer exists, and writes under it are
///   refused), completions, failures, reopenings, effect records.
///
/// - **A cancelled operation spoils the transaction: roll it back.** An
///   operation whose future is dropped before it finishes (a timeout around
///   it) leaves the transaction in a state the store cannot vouch for: the
///   savepoint it was opening may have been rolled back twice by sqlx, taking
///   the whole transaction with it, after which a commit commits nothing and
///   still reports success. After a cancelled operation, roll back and start
///   again; never commit.
///
/// The handle borrows the connection: drop it before committing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// # use taskfence::*;
/// # let path = std::env::temp_dir().join(format!("taskfence-doc-{}.db", uuid::Uuid::now_v7()));
/// # let store = SqliteStore::open(&path).await?;
/// # store.migrate().await?;
/// # let task = store.submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]))).await?.into_task();
/// # let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else { unreachable!() };
/// sqlx::query("CREATE TABLE IF NOT EXISTS replies (task_id BLOB, body TEXT)").execute(store.pool()).await?;
/// // The reply in the application's table and the completion: both or neither.
/// let mut tx = store.begin().await?;
/// sqlx::query("INSERT INTO replies (task_id, body) VALUES (?1, ?2)")
///     .bind(lease.task_id().as_uuid())
///     .bind("Here are the key decisions…")
///     .execute(&mut *tx)
///     .await?;
/// match store.on(&mut tx).complete(lease, "saved".into()).await? {
///     Fenced::Accepted(_) => tx.commit().await?,
///     Fenced::Rejected(_) => tx.rollback().await?, // someone else's answer stands
/// }
/// # Ok(()) }
/// ```
pub struct SqliteConnStore<'c> {
    store: SqliteStore,
    conn: Mutex<&'c mut SqliteConnection>,
}

impl fmt::Debug for SqliteConnStore<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteConnStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl<'c> SqliteConnStore<'c> {
    pub(super) fn new(store: SqliteStore, conn: &'c mut SqliteConnection) -> Self {
        Self {
            store,
            conn: Mutex::new(conn),
        }
    }

    /// The store whose clock and file this handle uses.
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// Fences the caller's own writes: checks that `lease` is current —
    /// its assignment, still running, unexpired on the store's clock. In a
    /// transaction begun with [`SqliteStore::begin`] the write lock is
    /// already held, so nothing can change the task before the commit:
    /// `Accepted`, write and commit; `Rejected`, roll back and stop.
    ///
    /// ```
    /// # async fn f(store: taskfence::SqliteStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.begin().await?;
    /// if store.on(&mut tx).fence(&lease).await?.is_accepted() {
    ///     sqlx::query("INSERT INTO progress (task_id, step) VALUES (?1, 3)")
    ///         .bind(lease.task_id().as_uuid())
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?; // only under a current lease
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self, lease: &Lease) -> Result<Fenced<()>> {
        async { run!(self, Write, |conn, now| ops::fence(conn, now, lease)) }
            .instrument(entry::lease_span("fence", lease))
            .await
    }

    /// [`Outbox::redispatch`](crate::dispatch::Outbox::redispatch) in the
    /// caller's transaction: a fresh handoff for each of `ids` still pending,
    /// published once the transaction commits.
    ///
    /// ```
    /// # async fn f(store: taskfence::SqliteStore, ids: Vec<taskfence::TaskId>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.begin().await?;
    /// let written = store.on(&mut tx).redispatch(&ids).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn redispatch(&self, ids: &[TaskId]) -> Result<u64> {
        limits::check_batch(ids.iter().copied())?;
        if ids.is_empty() {
            return Ok(0);
        }
        async { run!(self, Write, |conn, now| ops::redispatch(conn, now, ids)) }
            .instrument(entry::span("redispatch", None))
            .await
    }
}

/// The caller's connection, one operation at a time.
impl Site for SqliteConnStore<'_> {
    type Conn<'a>
        = MappedMutexGuard<'a, SqliteConnection>
    where
        Self: 'a;

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    async fn conn(&self) -> Result<MappedMutexGuard<'_, SqliteConnection>> {
        let mut conn = MutexGuard::map(self.conn.lock().await, |c| &mut **c);
        self.store.check_schema(&mut conn).await?;
        Ok(conn)
    }

    fn group(&self) -> Option<&Arc<Group>> {
        None
    }
}
