//! [`PgStore`] and its operations: each one statement (one round trip) on
//! the happy path, the `_in` variants on the caller's connection or
//! transaction, and the write → re-read → classify step a refused write takes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, PgRow};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::error::Error;
use crate::inspect::{Counts, Inspect, Order, Page, Story, TaskQuery};
use crate::limits;
use crate::policy::{Failure, Plan, StopReason, jitter_unit};
use crate::rules::{self, CancelRule, ClaimRule, LeaseCheck, ReopenRule};
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, Rejection, Result, Retry, RetryRequest,
    Submitted, TaskStore, check_completions,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};
use crate::trace;

use super::row::{self, interval, nanos};
use super::schema::{DEFAULT_SCHEMA, Schema};
use super::sql::{self, ListShape, Sql, Statements};
use super::{db, migrate};

/// How often a write that was refused, then found acceptable on the re-read,
/// is tried again before giving up. Never reached in practice: a refused
/// fenced write cannot become acceptable (versions only grow, the clock only
/// moves forward); it bounds the loop regardless.
const RACE_RETRIES: usize = 4;

/// A statement with its parameters bound, ready to run.
type Bound<'q> = sqlx::query::Query<'q, sqlx::Postgres, PgArguments>;

/// A fenced write kept missing while its re-read said it should pass.
#[derive(Debug, thiserror::Error)]
#[error("{0}: the row kept changing between the write and its re-read")]
struct Raced(&'static str);

/// What a completion statement returns: the whole task (`complete`), or the
/// row's version and finish instant (`complete_current`, whose task is the
/// lease's with what the completion wrote).
enum Completion {
    Task(Box<Task>),
    At(i64, OffsetDateTime),
}

/// The PostgreSQL [`TaskStore`]: durable, safe under any number of concurrent
/// workers and API replicas, one round trip per operation.
///
/// Cheap to clone (the pool is shared). Create the schema once with
/// [`PgStore::migrate`] (or run `migrations/` with your own tool).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use taskfence::{Claim, ClaimRequest, InputHash, NewTask, PgStore, RequestKey, Response, TaskStore};
///
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .test_before_acquire(false) // no extra ping per operation
///     .connect("postgres://postgres@127.0.0.1:5432/test")
///     .await?;
/// let store = PgStore::new(pool);
/// store.migrate().await?;
///
/// let key = RequestKey::new("user-1", "chat.reply", "req-1");
/// let task = store.submit(NewTask::new(key, InputHash::of(["msg-1"]))).await?.into_task();
/// if let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("worker-a", Duration::from_secs(30))).await? {
///     let saved = store.complete(lease, Response::from("hello")).await?;
///     assert!(saved.is_accepted());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    pub(super) pool: PgPool,
    pub(super) schema: Schema,
    pub(super) sql: std::sync::Arc<Statements>,
    /// Set once the schema's history was found current (or this store
    /// migrated it): until then each operation checks it first.
    pub(super) migrated: std::sync::Arc<AtomicBool>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema.name())
            .field("pool", &self.pool)
            .finish()
    }
}

/// Configures a [`PgStore`]: today, the schema its tables live in.
///
/// ```no_run
/// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
/// let store = taskfence::PgStore::builder(pool).schema("jobs").build()?;
/// assert_eq!(store.schema(), "jobs");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "call build() to get the store"]
pub struct PgStoreBuilder {
    pool: PgPool,
    schema: String,
}

impl PgStoreBuilder {
    /// The schema for the tables (a lowercase SQL identifier). Default [`DEFAULT_SCHEMA`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Builds the store; fails with [`InvalidInput::NotAnIdentifier`](crate::InvalidInput::NotAnIdentifier) for a bad schema name.
    pub fn build(self) -> Result<PgStore> {
        let schema = Schema::new(&self.schema)?;
        Ok(PgStore {
            sql: std::sync::Arc::new(Statements::new(&schema.quoted())),
            pool: self.pool,
            schema,
            migrated: std::sync::Arc::default(),
        })
    }
}

impl PgStore {
    /// A store in the [`DEFAULT_SCHEMA`] schema.
    ///
    /// Build the pool with `test_before_acquire(false)` to keep each operation
    /// at one round trip (otherwise sqlx pings the connection first).
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) {
    /// let store = taskfence::PgStore::new(pool);
    /// # }
    /// ```
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool)
            .build()
            .expect("the default schema name is valid")
    }

    /// A builder, to choose the schema.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
    /// let store = taskfence::PgStore::builder(pool).schema("taskfence_test_1").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(pool: PgPool) -> PgStoreBuilder {
        PgStoreBuilder {
            pool,
            schema: DEFAULT_SCHEMA.to_owned(),
        }
    }

    /// The schema the tables live in.
    ///
    /// ```no_run
    /// # fn f(pool: sqlx::PgPool) {
    /// assert_eq!(taskfence::PgStore::new(pool).schema(), "taskfence");
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        self.schema.name()
    }

    /// The pool the store runs on.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::PgStore) {
    /// let pool: &sqlx::PgPool = store.pool();
    /// # }
    /// ```
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The SQL of every operation, rendered for this store's schema, by name
    /// (`"claim"`, `"complete"`, `"due"`…; `"read"` is the re-read that
    /// classifies a refused write): to review them, or `EXPLAIN` them on your
    /// own data as `docs/POSTGRES.md` does.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::PgStore) {
    /// for (name, sql) in store.statements() {
    ///     println!("-- {name}\n{sql};");
    /// }
    /// # }
    /// ```
    pub fn statements(&self) -> Vec<(&'static str, &str)> {
        self.sql.all()
    }

    /// Applies the embedded migrations to this store's schema (see [`migrate`]).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        migrate::run(&self.pool, &self.schema).await?;
        self.migrated.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// [`TaskStore::submit`] on the caller's connection or transaction, so the
    /// application's own writes (the user's message) and the task with its
    /// handoff commit or roll back together.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, new: taskfence::NewTask) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO messages (id, body) VALUES ($1, $2)")
    ///     .bind(42_i64)
    ///     .bind("What are the key decisions?")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// let task = store.submit_in(&mut tx, new).await?.into_task();
    /// tx.commit().await?; // message, task and handoff: all or nothing
    /// # Ok(()) }
    /// ```
    pub async fn submit_in(&self, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
        new.validate()?;
        self.submit_on(conn, new).await
    }

    /// [`claim`](TaskStore::claim) on the caller's connection or transaction.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut conn = store.pool().acquire().await?;
    /// let claim = store.claim_in(&mut conn, id, taskfence::ClaimRequest::new("w", Duration::from_secs(30))).await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        id: TaskId,
        request: ClaimRequest,
    ) -> Result<Claim> {
        request.validate()?;
        self.claim_on(conn, id, request).await
    }

    /// [`TaskStore::complete`] on the caller's connection or transaction, so
    /// the application can write the reply into its own tables and complete the
    /// task atomically. The row lock is held until the caller commits.
    ///
    /// One statement that locks the row first, then checks version, status,
    /// lease (on `clock_timestamp()`, read after the lock) and the absence of a
    /// response, and saves: the textbook `BEGIN / SELECT … FOR UPDATE / UPDATE /
    /// COMMIT` decision in one round trip (see the [module documentation](crate::postgres)).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO replies (task_id, body) VALUES ($1, $2)")
    ///     .bind(lease.task_id().as_uuid())
    ///     .bind("Here are the key decisions…")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// match store.complete_in(&mut tx, lease, "saved".into()).await? {
    ///     taskfence::Fenced::Accepted(_) => tx.commit().await?,
    ///     taskfence::Fenced::Rejected(_) => tx.rollback().await?, // someone else's answer stands
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        limits::check_response(&response)?;
        self.complete_on(conn, lease, response).await
    }

    /// [`TaskStore::fail`] on the caller's connection or transaction.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, lease: taskfence::Lease) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let retry = store.fail_in(&mut tx, lease, taskfence::Failure::retryable("429")).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fail_in(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        failure: Failure,
    ) -> Result<Fenced<Retry>> {
        failure.validate()?;
        self.fail_on(conn, lease, failure).await
    }

    /// [`TaskStore::cancel`] on the caller's connection or transaction (e.g.
    /// together with deleting the user's message).
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// store.cancel_in(&mut tx, id, "message deleted").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn cancel_in(&self, conn: &mut PgConnection, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        limits::check_reason(reason)?;
        self.cancel_on(conn, id, reason).await
    }

    /// [`TaskStore::retry`] on the caller's connection or transaction (e.g.
    /// together with the operator's own audit record). The row lock is held
    /// until the caller commits.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let reopened = store.retry_in(&mut tx, id, taskfence::RetryRequest::new("alice", "quota raised")).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn retry_in(
        &self,
        conn: &mut PgConnection,
        id: TaskId,
        request: RetryRequest,
    ) -> Result<Fenced<Task>> {
        request.validate()?;
        self.retry_on(conn, id, request).await
    }

    /// Writes a fresh, unpublished handoff for each of `ids` that is still
    /// pending, so the running dispatcher ([`dispatch`](Self::dispatch))
    /// publishes it again: what an operator does with the tasks
    /// [`stranded`](Inspect::stranded) lists, whose queue message was lost.
    /// Returns how many handoffs were written; unknown and no longer pending
    /// tasks are skipped (a task claimed meanwhile needs no message). A
    /// duplicate message is harmless: claims decide who works.
    ///
    /// Ids must be distinct and at most [`limits::MAX_BATCH`]; bad input is a
    /// typed error and writes nothing.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// use std::time::Duration;
    /// use taskfence::inspect::Inspect;
    /// let lost: Vec<_> = store.stranded(Duration::from_secs(3600), 100).await?.iter().map(|t| t.id).collect();
    /// let written = store.redispatch(&lost).await?;
    /// # Ok(()) }
    /// ```
    pub async fn redispatch(&self, ids: &[TaskId]) -> Result<u64> {
        limits::check_batch(ids.iter().copied())?;
        if ids.is_empty() {
            return Ok(0);
        }
        let span = trace::op("redispatch", None, None, None);
        async move {
            let done = self
                .sql
                .redispatch
                .query()
                .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(done.rows_affected())
        }
        .instrument(span)
        .await
    }

    // The operations themselves, on a connection, input already validated:
    // the `_in` variants and the `TaskStore` methods both validate first and
    // then call these, so every operation validates exactly once.

    async fn submit_on(&self, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
        let id = TaskId::new();
        let deadline = new.policy.deadline;
        for _ in 0..RACE_RETRIES {
            let row = self
                .sql
                .submit
                .query()
                .bind(id.as_uuid())
                .bind(&new.key.scope)
                .bind(&new.key.operation)
                .bind(&new.key.key)
                .bind(&new.input_hash.as_bytes()[..])
                .bind(&new.payload)
                .bind(i32::try_from(new.policy.max_attempts).unwrap_or(i32::MAX))
                .bind(nanos(new.policy.initial_backoff))
                .bind(nanos(new.policy.max_backoff))
                .bind(new.policy.multiplier)
                .bind(new.policy.jitter)
                .bind(deadline.map(nanos))
                .bind(row::on_ambiguous_name(new.policy.on_ambiguous))
                .bind(deadline.map(interval))
                .bind(interval(new.retention))
                .bind(new.acceptance.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            let task = match row {
                Some(row) if row.try_get::<bool, _>("created").map_err(db)? => {
                    let created_at = row.try_get("created_at").map_err(db)?;
                    let expires_at = row.try_get("expires_at").map_err(db)?;
                    return Ok(Submitted::Created(Task::submitted(
                        id, new, created_at, expires_at,
                    )));
                }
                Some(row) => row::task(&row).map_err(db)?,
                // A racing submit of the same key committed after this
                // statement's snapshot: a fresh read sees it.
                None => match self.find_on(conn, &new.key).await? {
                    Some(task) => task,
                    None => continue, // the racer rolled back: try again
                },
            };
            if task.input_hash != new.input_hash {
                return Err(Error::KeyConflict { existing: task.id });
            }
            return Ok(Submitted::Existing(task));
        }
        Err(Error::storage(Raced("submit")))
    }

    async fn claim_on(&self, conn: &mut PgConnection, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        let attempt_id = AttemptId::new();
        // Most claims are a task's first: a statement that writes only an
        // available row holding no attempt and returns nothing otherwise.
        if let Some(row) = self
            .claim_row(conn, &self.sql.claim_fresh, id, attempt_id, &request)
            .await?
        {
            return taken(&row, attempt_id, &request);
        }
        for _ in 0..RACE_RETRIES {
            // A read answers a duplicate delivery (busy, done, backing off)
            // without a row lock, so it never queues behind the holder.
            match self.read_on(conn, id).await? {
                None => return Ok(Claim::NotFound),
                Some((task, now)) => {
                    if let ClaimRule::Answer(claim) = rules::claim(&task, now) {
                        return Ok(claim);
                    }
                }
            }
            // Available: a retry or a takeover. The full statement moves the
            // replaced attempt to the journal; it leaves the row only if it
            // changed while the statement waited for its lock.
            if let Some(claim) = self.claim_full(conn, id, attempt_id, &request).await? {
                return Ok(claim);
            }
        }
        Err(Error::storage(Raced("claim")))
    }

    /// The full claim statement: the claim it decides, or `None` when it left
    /// a row its snapshot shows available.
    async fn claim_full(
        &self,
        conn: &mut PgConnection,
        id: TaskId,
        attempt_id: AttemptId,
        request: &ClaimRequest,
    ) -> Result<Option<Claim>> {
        let Some(row) = self
            .claim_row(conn, &self.sql.claim, id, attempt_id, request)
            .await?
        else {
            return Ok(Some(Claim::NotFound));
        };
        if row.try_get::<bool, _>("written").map_err(db)? {
            return taken(&row, attempt_id, request).map(Some);
        }
        let task = row::task(&row).map_err(db)?;
        // Not taken: `task` is this statement's snapshot of the row. An
        // answer (done, busy, backoff) from it holds.
        let now: OffsetDateTime = row.try_get("store_now").map_err(db)?;
        Ok(match rules::claim(&task, now) {
            ClaimRule::Answer(claim) => Some(claim),
            _ => None,
        })
    }

    /// Runs a claim statement (both take the same parameters).
    async fn claim_row(
        &self,
        conn: &mut PgConnection,
        sql: &Sql,
        id: TaskId,
        attempt_id: AttemptId,
        request: &ClaimRequest,
    ) -> Result<Option<PgRow>> {
        sql.query()
            .bind(id.as_uuid())
            .bind(attempt_id.as_uuid())
            .bind(interval(request.lease))
            .bind(&request.worker)
            .bind(StopReason::AttemptsExhausted.as_str())
            .bind(StopReason::DeadlineExhausted.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)
    }

    async fn complete_on(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        let current = sql::current_only(&[&lease]);
        let statement = if current {
            &self.sql.complete_current
        } else {
            &self.sql.complete
        };
        let query = || {
            statement
                .query()
                .bind(lease.task_id().as_uuid())
                .bind(version(&lease))
                .bind(response.as_bytes())
        };
        let done = self
            .checked_write(conn, "complete", rules::accept, &lease, query, |row| {
                if current {
                    let version: i64 = row.try_get("version").map_err(db)?;
                    Ok(Completion::At(version, row.try_get("finished_at").map_err(db)?))
                } else {
                    row::task(&row)
                        .map(|task| Completion::Task(Box::new(task)))
                        .map_err(db)
                }
            })
            .await?;
        Ok(match done {
            Fenced::Rejected(rejection) => Fenced::Rejected(rejection),
            Fenced::Accepted(Completion::Task(task)) => Fenced::Accepted(*task),
            Fenced::Accepted(Completion::At(v, finished_at)) if v == version(&lease) => {
                Fenced::Accepted(lease.into_task().completed(response, finished_at))
            }
            // A later assignment's row answered (a first-valid-answer task
            // under a lease that says otherwise): the row itself tells.
            Fenced::Accepted(Completion::At(..)) => match self.get_in(conn, lease.task_id()).await? {
                Some(task) => Fenced::Accepted(task),
                None => return Err(Error::storage(Raced("complete"))),
            },
        })
    }

    async fn fail_on(
        &self,
        conn: &mut PgConnection,
        lease: Lease,
        failure: Failure,
    ) -> Result<Fenced<Retry>> {
        // The policy's decision is pure (reused from `RetryPolicy::plan`); only
        // the deadline comparison needs the store clock and happens in SQL.
        let policy = &lease.task().policy;
        let (stop, delay) = match policy.plan(
            failure.kind,
            lease.task().attempts_in_budget(),
            jitter_unit(lease.attempt_id()),
        ) {
            Plan::Stop(reason) => (Some(reason.message(&failure.message)), Duration::ZERO),
            Plan::RetryAfter(delay) => (None, delay),
        };
        let deadline_message = StopReason::DeadlineExhausted.message(&failure.message);
        let query = || {
            self.sql
                .fail
                .query()
                .bind(lease.task_id().as_uuid())
                .bind(version(&lease))
                .bind(stop.as_deref())
                .bind(&failure.message)
                .bind(&deadline_message)
                .bind(interval(delay))
                .bind(AttemptOutcome::Failed(failure.kind).as_str())
        };
        self.fenced_write(conn, "fail", &lease, query, |row| {
            let task = row::task(&row).map_err(db)?;
            Ok(match (task.status, task.not_before) {
                (Status::Pending, Some(not_before)) => Retry::Scheduled {
                    not_before,
                    attempts_left: task.attempts_left(),
                },
                _ => Retry::Exhausted(Box::new(task)),
            })
        })
        .await
    }

    async fn cancel_on(&self, conn: &mut PgConnection, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        for _ in 0..RACE_RETRIES {
            let row = self
                .sql
                .cancel
                .query()
                .bind(id.as_uuid())
                .bind(reason)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            if let Some(row) = row {
                return Ok(Fenced::Accepted(row::task(&row).map_err(db)?));
            }
            let (task, _) = self.read_on(conn, id).await?.ok_or(Error::NotFound(id))?;
            match rules::cancel(&task) {
                CancelRule::Answer(answer) => return Ok(answer),
                CancelRule::Cancel => continue, // it became live again between write and read
            }
        }
        Err(Error::storage(Raced("cancel")))
    }

    async fn retry_on(
        &self,
        conn: &mut PgConnection,
        id: TaskId,
        request: RetryRequest,
    ) -> Result<Fenced<Task>> {
        // Without a new policy the flag is false and the stored one stays;
        // the bound values are then ignored.
        let policy = request.policy.unwrap_or_default();
        for _ in 0..RACE_RETRIES {
            let row = self
                .sql
                .retry
                .query()
                .bind(id.as_uuid())
                .bind(&request.by)
                .bind(&request.reason)
                .bind(request.policy.is_some())
                .bind(i32::try_from(policy.max_attempts).unwrap_or(i32::MAX))
                .bind(nanos(policy.initial_backoff))
                .bind(nanos(policy.max_backoff))
                .bind(policy.multiplier)
                .bind(policy.jitter)
                .bind(policy.deadline.map(nanos))
                .bind(row::on_ambiguous_name(policy.on_ambiguous))
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            if let Some(row) = row {
                return Ok(Fenced::Accepted(row::task(&row).map_err(db)?));
            }
            let (task, _) = self.read_on(conn, id).await?.ok_or(Error::NotFound(id))?;
            match rules::reopen(&task) {
                ReopenRule::Answer(rejection) => {
                    tracing::debug!(%rejection, "retry rejected");
                    return Ok(Fenced::Rejected(rejection));
                }
                ReopenRule::Reopen => continue, // it became terminal between write and read
            }
        }
        Err(Error::storage(Raced("retry")))
    }

    /// Runs a fenced write of `lease`: `query` builds the statement (again
    /// for each try), `accepted` reads the row it returns. Zero rows is not an
    /// error: one re-read of the row, classified by [`rules::fence`], says why
    /// it was refused; should the fence pass on that read (the row changed
    /// between the two), the write is tried again.
    async fn fenced_write<'q, T>(
        &self,
        conn: &mut PgConnection,
        op: &'static str,
        lease: &Lease,
        query: impl Fn() -> Bound<'q> + Send,
        accepted: impl Fn(PgRow) -> Result<T> + Send,
    ) -> Result<Fenced<T>> {
        self.checked_write(conn, op, rules::fence, lease, query, accepted)
            .await
    }

    /// [`fenced_write`](Self::fenced_write) for a write that `check` decides
    /// (a completion: [`rules::accept`]), so the re-read classifies a refusal
    /// by the same rule the statement's guard applies.
    async fn checked_write<'q, T>(
        &self,
        conn: &mut PgConnection,
        op: &'static str,
        check: LeaseCheck,
        lease: &Lease,
        query: impl Fn() -> Bound<'q> + Send,
        accepted: impl Fn(PgRow) -> Result<T> + Send,
    ) -> Result<Fenced<T>> {
        for _ in 0..RACE_RETRIES {
            if let Some(row) = query().fetch_optional(&mut *conn).await.map_err(db)? {
                return accepted(row).map(Fenced::Accepted);
            }
            if let Some(rejection) = self.rejection_on(conn, check, lease).await? {
                return Ok(Fenced::Rejected(rejection));
            }
        }
        Err(Error::storage(Raced(op)))
    }

    /// [`TaskStore::get`] on the caller's connection or transaction.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore, id: taskfence::TaskId) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// let task = store.get_in(&mut tx, id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_in(&self, conn: &mut PgConnection, id: TaskId) -> Result<Option<Task>> {
        self.sql
            .get
            .query()
            .bind(id.as_uuid())
            .fetch_optional(conn)
            .await
            .map_err(db)?
            .map(|row| row::task(&row).map_err(db))
            .transpose()
    }

    async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        let mut conn = self.pool.acquire().await.map_err(db)?;
        self.check_schema(&mut conn).await?;
        Ok(conn)
    }

    /// [`Error::NotMigrated`] unless the schema's history reaches this
    /// library's latest migration. One read, until it passes once.
    async fn check_schema(&self, conn: &mut PgConnection) -> Result<()> {
        if self.migrated.load(Ordering::Relaxed) {
            return Ok(());
        }
        let version: Option<i64> = self
            .sql
            .schema_version
            .query()
            .fetch_one(conn)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        match version {
            Some(v) if v >= migrate::LATEST => {
                self.migrated.store(true, Ordering::Relaxed);
                Ok(())
            }
            v => Err(Error::NotMigrated {
                detail: format!(
                    "schema {} is at migration {}, this library needs {}",
                    self.schema.name(),
                    v.unwrap_or(0),
                    migrate::LATEST
                ),
                fix: super::MIGRATE_FIX,
            }),
        }
    }

    async fn find_on(&self, conn: &mut PgConnection, key: &RequestKey) -> Result<Option<Task>> {
        self.sql
            .find
            .query()
            .bind(&key.scope)
            .bind(&key.operation)
            .bind(&key.key)
            .fetch_optional(conn)
            .await
            .map_err(db)?
            .map(|row| row::task(&row).map_err(db))
            .transpose()
    }

    /// The row and the store clock, read together with a fresh snapshot.
    async fn read_on(&self, conn: &mut PgConnection, id: TaskId) -> Result<Option<(Task, OffsetDateTime)>> {
        let Some(row) = self
            .sql
            .read
            .query()
            .bind(id.as_uuid())
            .fetch_optional(conn)
            .await
            .map_err(db)?
        else {
            return Ok(None);
        };
        let task = row::task(&row).map_err(db)?;
        let now = row.try_get("store_now").map_err(db)?;
        Ok(Some((task, now)))
    }

    /// Why a write of `lease` matched no row: one read, classified by `check`.
    /// `None` means the check passes now (the caller writes again).
    async fn rejection_on(
        &self,
        conn: &mut PgConnection,
        check: LeaseCheck,
        lease: &Lease,
    ) -> Result<Option<Rejection>> {
        let (task, now) = self
            .read_on(conn, lease.task_id())
            .await?
            .ok_or(Error::NotFound(lease.task_id()))?;
        let rejection = check(&task, lease.version(), now).err();
        if let Some(r) = &rejection {
            tracing::debug!(rejection = %r, "fenced write rejected");
        }
        Ok(rejection)
    }
}

/// The claim of a row a claim statement wrote, recorded on the span.
fn taken(row: &PgRow, attempt_id: AttemptId, request: &ClaimRequest) -> Result<Claim> {
    let task = row::task(row).map_err(db)?;
    let span = tracing::Span::current();
    span.record("version", task.version);
    span.record("attempt_id", tracing::field::display(attempt_id));
    Ok(written_claim(task, attempt_id, request.worker.clone()))
}

/// The answer to a claim whose row was written: taken (a lease) or, when the
/// budget was spent, terminally failed.
fn written_claim(task: Task, attempt_id: AttemptId, worker: String) -> Claim {
    match (task.status, task.lease_until) {
        (Status::Running, Some(until)) => Claim::Acquired(Lease::new(task, attempt_id, worker, until)),
        _ => Claim::Failed(task),
    }
}

/// Rows of a batch statement by task id (with the store clock, when read).
fn rows_by_id(rows: Vec<PgRow>) -> Result<HashMap<TaskId, PgRow>> {
    rows.into_iter()
        .map(|row| Ok((TaskId::from_uuid(row.try_get("id").map_err(db)?), row)))
        .collect()
}

fn version(lease: &Lease) -> i64 {
    i64::try_from(lease.version()).unwrap_or(i64::MAX)
}

#[async_trait]
impl TaskStore for PgStore {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        task.validate()?;
        let span = trace::op("submit", None, None, None);
        async move { self.submit_on(&mut *self.acquire().await?, task).await }
            .instrument(span)
            .await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        let span = trace::op("get", Some(id), None, None);
        async move { self.get_in(&mut *self.acquire().await?, id).await }
            .instrument(span)
            .await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        key.validate()?;
        let span = trace::op("find", None, None, None);
        async move { self.find_on(&mut *self.acquire().await?, key).await }
            .instrument(span)
            .await
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        request.validate()?;
        let span = trace::op("claim", Some(id), None, None);
        async move { self.claim_on(&mut *self.acquire().await?, id, request).await }
            .instrument(span)
            .await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        limits::check_extension(extend_by)?;
        let span = trace::lease_op("renew", lease);
        async move {
            let query = || {
                self.sql
                    .renew
                    .query()
                    .bind(lease.task_id().as_uuid())
                    .bind(version(lease))
                    .bind(interval(extend_by))
            };
            let renewed = self
                .fenced_write(&mut *self.acquire().await?, "renew", lease, query, |row| {
                    row.try_get::<OffsetDateTime, _>("lease_until").map_err(db)
                })
                .await?;
            Ok(renewed.map(|until| lease.set_expires_at(until)))
        }
        .instrument(span)
        .await
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        limits::check_response(&response)?;
        let span = trace::lease_op("complete", &lease);
        async move {
            self.complete_on(&mut *self.acquire().await?, lease, response)
                .await
        }
        .instrument(span)
        .await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        failure.validate()?;
        let span = trace::lease_op("fail", &lease);
        async move { self.fail_on(&mut *self.acquire().await?, lease, failure).await }
            .instrument(span)
            .await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let span = trace::lease_op("release", &lease);
        async move {
            let query = || {
                self.sql
                    .release
                    .query()
                    .bind(lease.task_id().as_uuid())
                    .bind(version(&lease))
            };
            self.fenced_write(&mut *self.acquire().await?, "release", &lease, query, |_| Ok(()))
                .await
        }
        .instrument(span)
        .await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        limits::check_reason(reason)?;
        let span = trace::op("cancel", Some(id), None, None);
        async move { self.cancel_on(&mut *self.acquire().await?, id, reason).await }
            .instrument(span)
            .await
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        limits::check_operation_id(operation_id)?;
        let span = trace::lease_op("record_operation", lease);
        async move {
            let query = || {
                self.sql
                    .record_operation
                    .query()
                    .bind(lease.task_id().as_uuid())
                    .bind(version(lease))
                    .bind(operation_id)
            };
            self.fenced_write(
                &mut *self.acquire().await?,
                "record_operation",
                lease,
                query,
                |_| Ok(()),
            )
            .await
        }
        .instrument(span)
        .await
    }

    async fn retry(&self, id: TaskId, request: RetryRequest) -> Result<Fenced<Task>> {
        request.validate()?;
        let span = trace::op("retry", Some(id), None, None);
        async move { self.retry_on(&mut *self.acquire().await?, id, request).await }
            .instrument(span)
            .await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let span = trace::op("attempts", Some(id), None, None);
        async move {
            self.sql
                .attempts
                .query()
                .bind(id.as_uuid())
                .fetch_all(&self.pool)
                .await
                .map_err(db)?
                .iter()
                .map(|row| row::attempt(row).map_err(db))
                .collect()
        }
        .instrument(span)
        .await
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        limits::check_scan_limit(limit)?;
        let span = trace::op("due", None, None, None);
        async move {
            self.sql
                .due
                .query()
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?
                .iter()
                .map(|row| row.try_get("id").map(TaskId::from_uuid).map_err(db))
                .collect()
        }
        .instrument(span)
        .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        limits::check_scan_limit(limit)?;
        let span = trace::op("purge_expired", None, None, None);
        async move {
            let done = self
                .sql
                .purge_expired
                .query()
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(done.rows_affected())
        }
        .instrument(span)
        .await
    }

    /// One statement for the whole batch (see `claim_many` in `sql.rs`); a
    /// task whose row changed while the statement waited for its lock is
    /// decided again on its own.
    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        limits::check_batch(ids.iter().copied())?;
        request.validate()?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let span = trace::op("claim_many", None, None, None);
        async move {
            let mut conn = self.acquire().await?;
            let attempts: Vec<AttemptId> = ids.iter().map(|_| AttemptId::new()).collect();
            let rows = self
                .sql
                .claim_many
                .query()
                .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
                .bind(attempts.iter().map(|a| a.as_uuid()).collect::<Vec<_>>())
                .bind(interval(request.lease))
                .bind(&request.worker)
                .bind(StopReason::AttemptsExhausted.as_str())
                .bind(StopReason::DeadlineExhausted.as_str())
                .fetch_all(&mut *conn)
                .await
                .map_err(db)?;
            let mut rows = rows_by_id(rows)?;
            let mut claims = Vec::with_capacity(ids.len());
            for (&id, &attempt_id) in ids.iter().zip(&attempts) {
                let Some(row) = rows.remove(&id) else {
                    claims.push(Claim::NotFound);
                    continue;
                };
                let task = row::task(&row).map_err(db)?;
                if row.try_get::<bool, _>("written").map_err(db)? {
                    claims.push(written_claim(task, attempt_id, request.worker.clone()));
                    continue;
                }
                let now: OffsetDateTime = row.try_get("store_now").map_err(db)?;
                claims.push(match rules::claim(&task, now) {
                    ClaimRule::Answer(claim) => claim,
                    _ => self.claim_on(&mut conn, id, request.clone()).await?,
                });
            }
            Ok(claims)
        }
        .instrument(span)
        .await
    }

    /// One statement for the whole batch (see `complete_many` in `sql.rs`),
    /// and one read of the refused rows to say why each was refused.
    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        check_completions(&completions)?;
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let span = trace::op("complete_many", None, None, None);
        async move {
            let mut conn = self.acquire().await?;
            let ids: Vec<_> = completions.iter().map(|(l, _)| l.task_id().as_uuid()).collect();
            let leases: Vec<_> = completions.iter().map(|(l, _)| l).collect();
            let rows = self
                .sql
                .completion_many(&leases)
                .query()
                .bind(&ids)
                .bind(completions.iter().map(|(l, _)| version(l)).collect::<Vec<_>>())
                .bind(completions.iter().map(|(_, r)| r.as_bytes()).collect::<Vec<_>>())
                .fetch_all(&mut *conn)
                .await
                .map_err(db)?;
            let mut saved = rows_by_id(rows)?;
            let refused: Vec<_> = completions
                .iter()
                .map(|(l, _)| l.task_id())
                .filter(|id| !saved.contains_key(id))
                .map(|id| id.as_uuid())
                .collect();
            let mut reread = if refused.is_empty() {
                HashMap::new()
            } else {
                let rows = self
                    .sql
                    .read_many
                    .query()
                    .bind(&refused)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?;
                rows_by_id(rows)?
            };
            let mut out = Vec::with_capacity(completions.len());
            for (lease, response) in completions {
                let id = lease.task_id();
                if let Some(row) = saved.remove(&id) {
                    out.push(Ok(Fenced::Accepted(row::task(&row).map_err(db)?)));
                    continue;
                }
                let Some(row) = reread.remove(&id) else {
                    out.push(Err(Error::NotFound(id)));
                    continue;
                };
                let (task, now) = (
                    row::task(&row).map_err(db)?,
                    row.try_get("store_now").map_err(db)?,
                );
                out.push(match rules::accept(&task, lease.version(), now) {
                    Err(rejection) => Ok(Fenced::Rejected(rejection)),
                    // The row changed between the write and the read: decide it alone.
                    Ok(()) => match self.complete_on(&mut conn, lease, response).await {
                        Err(Error::NotFound(id)) => Err(Error::NotFound(id)),
                        other => Ok(other?),
                    },
                });
            }
            Ok(out)
        }
        .instrument(span)
        .await
    }
}

/// The bound that precedes (newest first) or follows (oldest first) every
/// task id: the cursor of a first page. UUID v7 ids never take either value.
fn open_cursor(order: Order) -> uuid::Uuid {
    match order {
        Order::NewestFirst => uuid::Uuid::max(),
        Order::OldestFirst => uuid::Uuid::nil(),
    }
}

/// Tasks of the rows of a statement that returns the task columns.
fn tasks(rows: &[PgRow]) -> Result<Vec<Task>> {
    rows.iter().map(|row| row::task(row).map_err(db)).collect()
}

/// Read-only, index-driven statements (plans at 10⁶ rows in
/// `docs/POSTGRES.md`): listings are keyset pages on the primary key's order,
/// one statement per combination of filters; counting one scope reads that
/// scope's index entries, counting all reads every entry of one index.
#[async_trait]
impl Inspect for PgStore {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        query.validate()?;
        let span = trace::op("list", None, None, None);
        async move {
            let shape = ListShape {
                status: query.status.is_some(),
                scope: query.scope.is_some(),
                operation: query.operation.is_some(),
                created_after: query.created_after.is_some(),
                created_before: query.created_before.is_some(),
                oldest_first: query.order == Order::OldestFirst,
            };
            let mut q = self.sql.list_of(shape).query();
            if let Some(status) = query.status {
                q = q.bind(status.as_str());
            }
            if let Some(scope) = &query.scope {
                q = q.bind(scope);
            }
            if let Some(operation) = &query.operation {
                q = q.bind(operation);
            }
            if let Some(at) = query.created_after {
                q = q.bind(at);
            }
            if let Some(at) = query.created_before {
                q = q.bind(at);
            }
            let cursor = query
                .after
                .map_or_else(|| open_cursor(query.order), |c| c.task_id().as_uuid());
            let rows = q
                .bind(cursor)
                .bind(i64::try_from(query.limit + 1).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            Ok(Page::from_overfetch(tasks(&rows)?, query.limit))
        }
        .instrument(span)
        .await
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        if let Some(scope) = scope {
            limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
        }
        let span = trace::op("counts", None, None, None);
        async move {
            let rows = match scope {
                Some(scope) => self.sql.counts_scope.query().bind(scope),
                None => self.sql.counts.query(),
            }
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
            let mut counts = Counts::default();
            for row in rows {
                let status: String = row.try_get("status").map_err(db)?;
                let n: i64 = row.try_get("n").map_err(db)?;
                let status = status
                    .parse::<Status>()
                    .map_err(|e| Error::storage(sqlx::Error::Decode(Box::new(e))))?;
                counts.add(status, u64::try_from(n).unwrap_or_default());
            }
            Ok(counts)
        }
        .instrument(span)
        .await
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        let span = trace::op("story", Some(id), None, None);
        async move {
            self.sql
                .story
                .query()
                .bind(id.as_uuid())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?
                .map(|row| row::story(&row).map_err(db))
                .transpose()
        }
        .instrument(span)
        .await
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<Task>> {
        limits::check_duration("older_than", older_than, limits::MAX_RETENTION)?;
        limits::check_page(limit)?;
        let span = trace::op("stranded", None, None, None);
        async move {
            let rows = self
                .sql
                .stranded
                .query()
                .bind(interval(older_than))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
            tasks(&rows)
        }
        .instrument(span)
        .await
    }
}
