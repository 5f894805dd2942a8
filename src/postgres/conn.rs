//! [`OnConnection`]: every operation of a [`PgStore`] on the caller's
//! connection or transaction.

use std::time::Duration;

use sqlx::postgres::PgConnection;
use tracing::Instrument;

use crate::backend::entry;
use crate::error::Result;
use crate::inspect::{Counts, Page, Story, TaskQuery};
use crate::limits;
use crate::policy::Failure;
use crate::store::{Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};

use super::{PgStore, ops};

/// A [`PgStore`]'s operations on one connection of the caller's — typically
/// a transaction — made by [`PgStore::on`]: the application's own writes and
/// the task's change commit or roll back together.
///
/// Each method has the contract of the [`TaskStore`](crate::TaskStore) (or
/// [`Inspect`](crate::inspect::Inspect)) method of the same name, checks its
/// input the same way (a typed error, nothing written) and runs the same
/// statements as the pool path. A fenced write locks the task's row until
/// the caller's transaction ends.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
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
#[derive(Debug)]
pub struct OnConnection<'c> {
    store: &'c PgStore,
    conn: &'c mut PgConnection,
}

impl<'c> OnConnection<'c> {
    pub(super) fn new(store: &'c PgStore, conn: &'c mut PgConnection) -> Self {
        Self { store, conn }
    }

    /// The connection, once the store knows its schema is current.
    async fn conn(&mut self) -> Result<&mut PgConnection> {
        self.store.check_schema(self.conn).await?;
        Ok(self.conn)
    }

    /// [`TaskStore::submit`](crate::TaskStore::submit): the task and its
    /// handoff, in the caller's transaction.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, new: taskfence::NewTask) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let task = store.on(&mut tx).submit(new).await?.into_task();
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn submit(&mut self, mut task: NewTask) -> Result<Submitted> {
        let span = entry::submit(&mut task)?;
        let store = self.store;
        async { ops::submit(&store.sql, self.conn().await?, task).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::get`](crate::TaskStore::get), reading what the
    /// transaction sees.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let task = store.on(&mut tx).get(id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get(&mut self, id: TaskId) -> Result<Option<Task>> {
        let store = self.store;
        async { ops::get(&store.sql, self.conn().await?, id).await }
            .instrument(entry::get(id))
            .await
    }

    /// [`TaskStore::find`](crate::TaskStore::find).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let key = taskfence::RequestKey::new("user-1", "chat.reply", "req-1");
    /// let task = store.on(&mut conn).find(&key).await?;
    /// # Ok(()) }
    /// ```
    pub async fn find(&mut self, key: &RequestKey) -> Result<Option<Task>> {
        let span = entry::find(key)?;
        let store = self.store;
        async { ops::find(&store.sql, self.conn().await?, key).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::claim`](crate::TaskStore::claim).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let claim = store.on(&mut conn).claim(id, taskfence::ClaimRequest::new("w", Duration::from_secs(30))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim(&mut self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let span = entry::claim(id, &request)?;
        let store = self.store;
        async { ops::claim(&store.sql, self.conn().await?, id, request).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::renew`](crate::TaskStore::renew).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, mut lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let renewed = store.on(&mut conn).renew(&mut lease, Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn renew(&mut self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        let span = entry::renew(lease, extend_by)?;
        let store = self.store;
        async { ops::renew(&store.sql, self.conn().await?, lease, extend_by).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::complete`](crate::TaskStore::complete): one statement that
    /// locks the row, then checks version, status, lease (on the store's
    /// clock, read after the lock) and the absence of a response, and saves.
    /// The lock is held until the caller commits.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let saved = store.on(&mut tx).complete(lease, "the answer".into()).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn complete(&mut self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        let span = entry::complete(&lease, &response)?;
        let store = self.store;
        async { ops::complete(&store.sql, self.conn().await?, lease, response).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::fail`](crate::TaskStore::fail).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let retry = store.on(&mut tx).fail(lease, taskfence::Failure::retryable("429")).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fail(&mut self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        let span = entry::fail(&lease, &failure)?;
        let store = self.store;
        async { ops::fail(&store.sql, self.conn().await?, lease, failure).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::release`](crate::TaskStore::release).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// store.on(&mut conn).release(lease).await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(&mut self, lease: Lease) -> Result<Fenced<()>> {
        let span = entry::release(&lease);
        let store = self.store;
        async { ops::release(&store.sql, self.conn().await?, lease).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::cancel`](crate::TaskStore::cancel), e.g. together with
    /// deleting the user's message.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// store.on(&mut tx).cancel(id, "message deleted").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn cancel(&mut self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        let span = entry::cancel(id, reason)?;
        let store = self.store;
        async { ops::cancel(&store.sql, self.conn().await?, id, reason).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::record_operation`](crate::TaskStore::record_operation).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// store.on(&mut conn).record_operation(&lease, "resp_0123").await?;
    /// # Ok(()) }
    /// ```
    pub async fn record_operation(&mut self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        let span = entry::record_operation(lease, operation_id)?;
        let store = self.store;
        async { ops::record_operation(&store.sql, self.conn().await?, lease, operation_id).await }
            .instrument(span)
            .await
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
    pub async fn fence(&mut self, lease: &Lease) -> Result<Fenced<()>> {
        let store = self.store;
        async { ops::fence(&store.sql, self.conn().await?, lease).await }
            .instrument(entry::lease_span("fence", lease))
            .await
    }

    /// [`TaskStore::attempts`](crate::TaskStore::attempts).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let attempts = store.on(&mut conn).attempts(id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn attempts(&mut self, id: TaskId) -> Result<Vec<Attempt>> {
        let store = self.store;
        async { ops::attempts(&store.sql, self.conn().await?, id).await }
            .instrument(entry::attempts(id))
            .await
    }

    /// [`TaskStore::reopen`](crate::TaskStore::reopen), e.g. together with
    /// the operator's own audit record. The row lock is held until the
    /// caller commits.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let request = taskfence::store::ReopenRequest::new("alice", "quota raised");
    /// let reopened = store.on(&mut tx).reopen(id, request).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn reopen(&mut self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        let span = entry::reopen(id, &request)?;
        let store = self.store;
        async { ops::reopen(&store.sql, self.conn().await?, id, request).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::due`](crate::TaskStore::due).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let due = store.on(&mut conn).due(100).await?;
    /// # Ok(()) }
    /// ```
    pub async fn due(&mut self, limit: usize) -> Result<Vec<TaskId>> {
        let span = entry::due(limit)?;
        let store = self.store;
        async { ops::due(&store.sql, self.conn().await?, limit).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::purge_expired`](crate::TaskStore::purge_expired).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let purged = store.on(&mut conn).purge_expired(100).await?;
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&mut self, limit: usize) -> Result<u64> {
        let span = entry::purge_expired(limit)?;
        let store = self.store;
        async { ops::purge_expired(&store.sql, self.conn().await?, limit).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::claim_many`](crate::TaskStore::claim_many).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, ids: Vec<taskfence::TaskId>) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let claims = store.on(&mut conn).claim_many(&ids, taskfence::ClaimRequest::new("w", Duration::from_secs(30))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim_many(&mut self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        let span = entry::claim_many(ids, &request)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.store;
        async { ops::claim_many(&store.sql, self.conn().await?, ids, request).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::complete_many`](crate::TaskStore::complete_many): a
    /// batch of replies and their completions in one transaction.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, batch: Vec<(taskfence::Lease, taskfence::Response)>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let saved = store.on(&mut tx).complete_many(batch).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn complete_many(
        &mut self,
        completions: Vec<(Lease, Response)>,
    ) -> Result<Vec<Result<Fenced<Task>>>> {
        let span = entry::complete_many(&completions)?;
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.store;
        async { ops::complete_many(&store.sql, self.conn().await?, completions).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::claim_next`](crate::TaskStore::claim_next): the next due
    /// tasks, claimed in the caller's transaction (their leases commit or
    /// roll back with it; until it ends, other callers skip them).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut tx = store.pool().begin().await?;
    /// let leases = store.on(&mut tx).claim_next(taskfence::ClaimNext::new("w", Duration::from_secs(30), 8)).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim_next(&mut self, request: ClaimNext) -> Result<Vec<Lease>> {
        let span = entry::claim_next(&request)?;
        let store = self.store;
        async { ops::claim_next(&store.sql, self.conn().await?, request).await }
            .instrument(span)
            .await
    }

    /// [`TaskStore::renew_many`](crate::TaskStore::renew_many).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, mut held: Vec<taskfence::Lease>) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let renewed = store.on(&mut conn).renew_many(&mut held, Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn renew_many(&mut self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        let span = entry::renew_many(leases, extend_by)?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.store;
        async { ops::renew_many(&store.sql, self.conn().await?, leases, extend_by).await }
            .instrument(span)
            .await
    }

    /// [`PgStore::redispatch`].
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, ids: Vec<taskfence::TaskId>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let written = store.on(&mut tx).redispatch(&ids).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn redispatch(&mut self, ids: &[TaskId]) -> Result<u64> {
        limits::check_batch(ids.iter().copied())?;
        if ids.is_empty() {
            return Ok(0);
        }
        let store = self.store;
        async { ops::redispatch(&store.sql, self.conn().await?, ids).await }
            .instrument(entry::span("redispatch", None))
            .await
    }

    /// [`Inspect::list`](crate::inspect::Inspect::list).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use taskfence::inspect::TaskQuery;
    /// let mut conn = store.pool().acquire().await?;
    /// let page = store.on(&mut conn).list(&TaskQuery::new().limit(10)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn list(&mut self, query: &TaskQuery) -> Result<Page> {
        let span = entry::list(query)?;
        let store = self.store;
        async { ops::list(&store.sql, self.conn().await?, query).await }
            .instrument(span)
            .await
    }

    /// [`Inspect::counts`](crate::inspect::Inspect::counts).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let counts = store.on(&mut conn).counts(Some("tenant-7")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn counts(&mut self, scope: Option<&str>) -> Result<Counts> {
        let span = entry::counts(scope)?;
        let store = self.store;
        async { ops::counts(&store.sql, self.conn().await?, scope).await }
            .instrument(span)
            .await
    }

    /// [`Inspect::story`](crate::inspect::Inspect::story).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = store.pool().acquire().await?;
    /// let story = store.on(&mut conn).story(id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn story(&mut self, id: TaskId) -> Result<Option<Story>> {
        let store = self.store;
        async { ops::story(&store.sql, self.conn().await?, id).await }
            .instrument(entry::story(id))
            .await
    }

    /// [`Inspect::stranded`](crate::inspect::Inspect::stranded).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let lost = store.on(&mut conn).stranded(Duration::from_secs(3600), 100).await?;
    /// # Ok(()) }
    /// ```
    pub async fn stranded(&mut self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        let span = entry::stranded(older_than, limit)?;
        let store = self.store;
        async { ops::stranded(&store.sql, self.conn().await?, older_than, limit).await }
            .instrument(span)
            .await
    }
}
