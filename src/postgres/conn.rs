//! [`PgConnStore`]: a [`PgStore`] whose statements run on the caller's
//! connection or transaction — a [`TaskStore`](crate::TaskStore) and an
//! [`Inspect`](crate::inspect::Inspect) like the store itself.

use std::fmt;

use sqlx::postgres::PgConnection;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tracing::Instrument;

use crate::backend::entry;
use crate::error::Result;
use crate::limits;
use crate::store::{Fenced, Lease};
use crate::task::TaskId;

use super::site::Site;
use super::sql::Statements;
use super::{PgStore, ops};

/// A [`PgStore`] on one connection of the caller's — typically a
/// transaction — made by [`PgStore::on`]. It is a
/// [`TaskStore`](crate::TaskStore) and an
/// [`Inspect`](crate::inspect::Inspect) with every operation (the effect
/// journal and the batches included), so anything written against a store —
/// a worker, an [interceptor](crate::intercept::Intercepted),
/// [`metrics::observe`](crate::metrics), a `&dyn TaskStore` — runs inside
/// the caller's transaction; and it adds [`fence`](Self::fence) and
/// [`redispatch`](Self::redispatch). Every operation checks its input like
/// the pool path (a typed error, nothing written) and runs the same code on
/// the caller's connection instead of a pooled one.
///
/// # Inside the caller's transaction
///
/// Each operation's statements are statements of the caller's transaction —
/// no savepoint, no transaction of their own, batches and `claim_next`
/// included. What that means:
///
/// - **Nothing is seen before the commit.** Other sessions do not see a
///   task submitted here, a claim, a completion or an effect record until
///   the caller commits; the dispatcher publishes a submitted task's handoff
///   only after it. Operations on this handle see the transaction's own
///   writes (`get` after `submit` finds the task).
/// - **Locks are held until the transaction ends.** Every write that
///   decides on a task's row (claim, renew, complete, fail, release, cancel,
///   record_operation, reopen, the effect journal, every batch) locks that
///   row when its statement runs, and [`fence`](Self::fence) takes a share
///   lock: another session's write to the task waits for the commit or
///   rollback, and another session's `claim_next` skips the task (`SKIP
///   LOCKED`). A duplicate delivery's claim elsewhere is answered from a
///   read and does not wait. Keep such transactions short.
/// - **Leases run on the store's clock, per statement.** The clock is
///   `clock_timestamp()` when each statement runs, not the transaction's
///   start or its commit: a lease claimed or renewed here starts counting at
///   that statement, so time the transaction spends before its commit is
///   taken from the lease, and other sessions see the lease only from the
///   commit on. A write accepted here under a lease that then expires
///   before the commit still commits: the row lock keeps any takeover
///   waiting until then, and the takeover then sees the written row.
/// - **A rollback undoes every write made through the handle**: submitted
///   tasks and their handoffs, claims (a lease from a rolled-back claim
///   names an assignment that no longer exists: the row is as before, and
///   writes under that lease are refused), completions, failures,
///   reopenings, effect records. Record an effect's intent
///   ([`begin_effect`](crate::TaskStore::begin_effect)) in a transaction you
///   commit *before* calling the provider: a rolled-back intent leaves no
///   trace of a call that may have happened.
/// - **A storage error ends the transaction's usefulness.** PostgreSQL
///   refuses every further statement of a transaction in which one failed
///   ([`Error::Storage`](crate::Error::Storage)): roll back. Refusals —
///   invalid input, [`Fenced::Rejected`], a key conflict, a task not
///   found — are decided before any statement or from what the statements
///   returned, and leave the transaction usable.
/// - **One statement at a time.** The connection runs one statement at a
///   time, so concurrent calls on one handle (a batch worked side by side)
///   wait for each other.
/// - **Read Committed** (PostgreSQL's default): each statement sees what was
///   committed when it started, plus the transaction's own writes. Under
///   Repeatable Read a concurrent update surfaces as a serialization failure
///   ([`Error::Storage`](crate::Error::Storage)).
///
/// The handle borrows the connection: drop it (or let it go out of scope)
/// before committing.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
/// use taskfence::TaskStore;
/// // The reply in the application's table and the completion: both or neither.
/// let mut tx = store.pool().begin().await?;
/// sqlx::query("INSERT INTO replies (task_id, body) VALUES ($1, $2)")
///     .bind(lease.task_id().as_uuid())
///     .bind("Here are the key decisions…")
///     .execute(&mut *tx)
///     .await?;
/// match store.on(&mut tx).complete(lease, "saved".into()).await? {
///     taskfence::Fenced::Accepted(_) => tx.commit().await?,
///     taskfence::Fenced::Rejected(_) => tx.rollback().await?, // someone else's answer stands
/// }
/// # Ok(()) }
/// ```
///
/// Code written against any store runs in the transaction unchanged:
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore, new: taskfence::NewTask) -> Result<(), Box<dyn std::error::Error>> {
/// async fn enqueue(store: &dyn taskfence::TaskStore, new: taskfence::NewTask) -> taskfence::Result<taskfence::TaskId> {
///     Ok(store.submit(new).await?.into_task().id)
/// }
/// let mut tx = store.pool().begin().await?;
/// let id = enqueue(&store.on(&mut tx), new).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct PgConnStore<'c> {
    store: PgStore,
    conn: Mutex<Connection<'c>>,
}

/// The connection a [`PgConnStore`] runs on.
enum Connection<'c> {
    /// The caller's.
    Caller(&'c mut PgConnection),
    /// Its own, in a transaction it began: the transaction fixture's.
    #[cfg(feature = "testing")]
    Owned(Box<PgConnection>),
}

impl Connection<'_> {
    fn get(&mut self) -> &mut PgConnection {
        match self {
            Connection::Caller(conn) => conn,
            #[cfg(feature = "testing")]
            Connection::Owned(conn) => conn,
        }
    }
}

impl fmt::Debug for PgConnStore<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnStore")
            .field("schema", &self.store.schema())
            .finish_non_exhaustive()
    }
}

impl<'c> PgConnStore<'c> {
    pub(super) fn new(store: PgStore, conn: &'c mut PgConnection) -> Self {
        Self {
            store,
            conn: Mutex::new(Connection::Caller(conn)),
        }
    }

    /// The store whose schema and statements this handle uses.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// assert_eq!(store.on(&mut tx).store().schema(), store.schema());
    /// # Ok(()) }
    /// ```
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// Fences the caller's own writes: checks that `lease` is current —
    /// its assignment, still running, unexpired on the store's clock — and
    /// holds the task row (a share lock) until the transaction ends, so no
    /// takeover, cancellation or other save can happen before it commits.
    /// Call it first in the transaction that writes what the work produced
    /// (index entries, partial progress): `Accepted`, write and commit;
    /// `Rejected` (superseded, expired, cancelled…), roll back and stop.
    /// One statement, one round trip.
    ///
    /// The lock makes a takeover wait for the transaction, however long it
    /// runs: keep these transactions short (the lease is not renewed by them).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// if store.on(&mut tx).fence(&lease).await?.is_accepted() {
    ///     sqlx::query("INSERT INTO progress (task_id, step) VALUES ($1, 3)")
    ///         .bind(lease.task_id().as_uuid())
    ///         .execute(&mut *tx)
    ///         .await?;
    ///     tx.commit().await?; // only under a current lease
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self, lease: &Lease) -> Result<Fenced<()>> {
        async { ops::fence(self.sql(), &mut *self.conn().await?, lease).await }
            .instrument(entry::lease_span("fence", lease))
            .await
    }

    /// [`Outbox::redispatch`](crate::dispatch::Outbox::redispatch) in the
    /// caller's transaction: a fresh handoff for each of `ids` still pending,
    /// published once the transaction commits.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, ids: Vec<taskfence::TaskId>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let written = store.on(&mut tx).redispatch(&ids).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn redispatch(&self, ids: &[TaskId]) -> Result<u64> {
        limits::check_batch(ids.iter().copied())?;
        if ids.is_empty() {
            return Ok(0);
        }
        async { ops::redispatch(self.sql(), &mut *self.conn().await?, ids).await }
            .instrument(entry::span("redispatch", None))
            .await
    }
}

#[cfg(feature = "testing")]
impl PgConnStore<'static> {
    /// `store` on a connection of its own, in a transaction begun on it that
    /// is never committed: dropping the handle closes the connection, which
    /// rolls it back.
    pub(crate) async fn owning(store: PgStore, mut conn: PgConnection) -> Result<Self> {
        sqlx::raw_sql("BEGIN")
            .execute(&mut conn)
            .await
            .map_err(super::db)?;
        Ok(Self {
            store,
            conn: Mutex::new(Connection::Owned(Box::new(conn))),
        })
    }
}

/// The caller's connection, one operation at a time.
impl Site for PgConnStore<'_> {
    type Conn<'a>
        = MappedMutexGuard<'a, PgConnection>
    where
        Self: 'a;

    fn sql(&self) -> &Statements {
        &self.store.sql
    }

    fn handoffs(&self) -> bool {
        self.store.handoffs
    }

    async fn conn(&self) -> Result<MappedMutexGuard<'_, PgConnection>> {
        let mut conn = MutexGuard::map(self.conn.lock().await, Connection::get);
        self.store.check_schema(&mut conn).await?;
        Ok(conn)
    }
}
