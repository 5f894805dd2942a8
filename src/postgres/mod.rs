//! [`PgStore`]: the PostgreSQL backend (feature `postgres`), on sqlx.
//!
//! # Layout
//!
//! Everything lives in the crate's own schema (default [`DEFAULT_SCHEMA`],
//! configurable with [`PgStoreBuilder::schema`]): the tables `tasks`,
//! `attempts` and `handoffs`, the function `store_clock()`, and the embedded
//! runner's history table `taskfence_migrations`. The SQL files are in the
//! crate's `migrations/` directory; [`migrate`] / [`PgStore::migrate`] apply
//! them. See `docs/POSTGRES.md` for the schema, the indexes and the plans.
//!
//! # One round trip per operation
//!
//! Submit, claim, renew, complete, fail, release and record_operation are each
//! **one statement**: a chain of data-modifying CTEs that writes the task row,
//! the attempt row (and, for submit, the handoff) and returns the new row. A
//! refused write (zero rows) costs one more read of the row together with the
//! store clock, classified by the same [`rules::fence`] / [`rules::claim`]
//! functions every backend uses.
//!
//! # The store clock, read after the row lock
//!
//! Every statement reads time through `<schema>.store_clock()`, which is
//! `clock_timestamp()`: the time when it is *called*, not when the statement
//! or transaction started (`now()` / `CURRENT_TIMESTAMP`). The Rust process's
//! clock is never used.
//!
//! # Why one statement decides exactly as the seed's transaction
//!
//! The seed completes a task with
//! `BEGIN; SELECT … FOR UPDATE; UPDATE … WHERE version = $v AND status = 'running'
//! AND lease_until > clock_timestamp() AND response IS NULL; COMMIT;` under Read
//! Committed. [`PgStore`] sends one statement instead:
//!
//! ```sql
//! WITH locked AS MATERIALIZED (SELECT id FROM tasks WHERE id = $1 FOR NO KEY UPDATE),
//! done AS (
//!     UPDATE tasks SET status = 'completed', response = $3, … , finished_at = store_clock()
//!     WHERE id = (SELECT id FROM locked) AND version = $2 AND status = 'running'
//!       AND lease_until > store_clock() AND response IS NULL
//!     RETURNING …),
//! finished AS (UPDATE attempts SET outcome = 'completed', … FROM done …)
//! SELECT … FROM done
//! ```
//!
//! It decides exactly as the seed does:
//!
//! 1. **The lock first.** `id = (SELECT id FROM locked)` is an uncorrelated
//!    sub-select, which PostgreSQL runs as an InitPlan before the `UPDATE`
//!    reads any row. Its `FOR NO KEY UPDATE` is the seed's `SELECT … FOR UPDATE`
//!    (the lock an `UPDATE` takes anyway): it waits for any holder — a
//!    takeover, a renewal, a racing completion — to commit or roll back.
//! 2. **Then the guard, on the newest row.** The `UPDATE` reads the row with
//!    its statement snapshot. If the row was changed while the lock was
//!    awaited, the `UPDATE` sees that its version is outdated, fetches the
//!    newest committed version and re-evaluates the whole `WHERE` against it
//!    (EvalPlanQual). Either way the version, status and response conditions
//!    are decided on the row as it stands once the lock is held.
//! 3. **With the clock after the wait.** `store_clock()` is `VOLATILE` and
//!    written directly in the `WHERE`: it is called when the row is evaluated,
//!    after the InitPlan got the lock (and again at an EvalPlanQual recheck).
//! 4. **One atomic decision.** Check and write are one statement in one
//!    implicit transaction (or the caller's), and the lock is held until it
//!    commits: nobody takes the task over between the check and the save.
//!
//! Why not a plain `UPDATE … WHERE … lease_until > clock_timestamp()`: an
//! `UPDATE` evaluates its `WHERE` when it reads the row, *before* it waits
//! for the row lock. When the holder changes the row, EvalPlanQual
//! re-evaluates it after the wait, clock included; but when the holder only
//! *locked* the row (a `SELECT … FOR UPDATE` or `FOR SHARE`, such as
//! `record_operation`'s, or the application's own) there is no recheck, and
//! the lease would be compared with the time before the wait.
//! `tests/pg_fencing.rs` has that case: a completion that starts with a live
//! lease and waits behind a lock-only holder until the lease has passed is
//! refused with [`Rejection::LeaseExpired`].
//!
//! A row that passed the guard in the snapshot but not on recheck, or failed
//! it in the snapshot, yields zero rows; the classifying re-read then applies
//! [`rules::fence`] to the newest row. Should the fence pass there (possible
//! only when the same lease renewed concurrently at the expiry edge), the
//! write is tried again, so that case too ends as the seed's would.
//!
//! Claim, renew, fail, release and record_operation lock the row the same
//! way. Claims and failures decide between two outcomes (take or exhaust,
//! retry or stop) from the clock; their `SET (…) = (SELECT … FROM (SELECT
//! store_clock()) …)` reads the clock once per row, also after the lock, so
//! every column of the decision uses the same instant.
//!
//! # Inside the caller's transaction
//!
//! [`PgStore::submit_in`], [`PgStore::claim_in`], [`PgStore::complete_in`],
//! [`PgStore::fail_in`] and [`PgStore::cancel_in`] run on a `&mut PgConnection`
//! — typically `&mut *tx` — so the application's own writes and the task's
//! commit or roll back together. The [`TaskStore`] methods take a pooled
//! connection and call the same code. Use Read Committed (PostgreSQL's
//! default): under Repeatable Read a concurrent update surfaces as a
//! serialization failure ([`Error::Storage`]) instead of the recheck above.
//!
//! # The handoff
//!
//! [`submit`](TaskStore::submit) writes a handoff row in the same statement as
//! the task (a transactional outbox). [`PgStore::dispatch`] publishes them;
//! [`PgStore::dispatch_due`] re-publishes tasks whose lease expired or whose
//! backoff passed.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::error::{Error, InvalidInput};
use crate::limits;
use crate::memory::stop_message;
use crate::policy::{Failure, Plan, StopReason, jitter_unit};
use crate::rules::{self, ClaimRule};
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, Rejection, Result, Retry, Submitted,
    TaskStore,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};
use crate::trace;

#[cfg(feature = "testing")]
pub(crate) mod fixture;
mod migrate;
mod row;
mod sql;

use row::{interval, nanos};
use sql::Statements;

/// The schema [`PgStore::new`] and [`migrate`] use.
pub const DEFAULT_SCHEMA: &str = "taskfence";

/// How often a write that was refused, then found acceptable on the re-read,
/// is tried again before giving up. Never reached in practice: a refused
/// fenced write cannot become acceptable (versions only grow, the clock only
/// moves forward); it bounds the loop regardless.
const RACE_RETRIES: usize = 4;

/// Applies the embedded migrations to the [`DEFAULT_SCHEMA`] schema.
///
/// Safe to run from every replica at start-up: an advisory lock serializes
/// concurrent runs and each file is applied once, recorded in
/// `taskfence.taskfence_migrations` (never in the host's `_sqlx_migrations`).
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> taskfence::Result<()> {
/// taskfence::postgres::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<()> {
    migrate::run(pool, &Schema::new(DEFAULT_SCHEMA)?).await
}

/// A validated schema name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Schema(String);

impl Schema {
    pub(crate) fn new(name: &str) -> Result<Self, InvalidInput> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || name.len() > 63 {
            return Err(InvalidInput::NotAnIdentifier { field: "schema" });
        }
        Ok(Self(name.to_owned()))
    }

    pub(crate) fn name(&self) -> &str {
        &self.0
    }

    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

pub(crate) fn db(err: sqlx::Error) -> Error {
    Error::storage(err)
}

/// A fenced write kept missing while its re-read said it should pass.
#[derive(Debug, thiserror::Error)]
#[error("{0}: the row kept changing between the write and its re-read")]
struct Raced(&'static str);

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
    pool: PgPool,
    schema: Schema,
    sql: std::sync::Arc<Statements>,
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

    /// Builds the store; fails with [`InvalidInput::NotAnIdentifier`] for a bad schema name.
    pub fn build(self) -> Result<PgStore> {
        let schema = Schema::new(&self.schema)?;
        Ok(PgStore {
            sql: std::sync::Arc::new(Statements::new(&schema.quoted())),
            pool: self.pool,
            schema,
        })
    }
}

/// What one [`PgStore::dispatch`] or [`PgStore::dispatch_due`] round did.
///
/// ```
/// # fn f(d: taskfence::postgres::Dispatched<std::io::Error>) {
/// println!("published {} tasks", d.published.len());
/// if let Some((task, err)) = d.failed {
///     eprintln!("publishing {task} failed, will retry next round: {err}");
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Dispatched<E> {
    /// The tasks published (and, for handoffs, marked published), in order.
    pub published: Vec<TaskId>,
    /// The first task whose publication failed, with the error; the round
    /// stopped there and that handoff stays pending for the next round.
    pub failed: Option<(TaskId, E)>,
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
        migrate::run(&self.pool, &self.schema).await
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
        let id = TaskId::new();
        let deadline = new.policy.deadline;
        for _ in 0..RACE_RETRIES {
            let row = sqlx::query(&self.sql.submit)
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
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            let (created, task) = match row {
                Some(row) => (
                    row.try_get::<bool, _>("created").map_err(db)?,
                    row::task(&row).map_err(db)?,
                ),
                // A racing submit of the same key committed after this
                // statement's snapshot: a fresh read sees it.
                None => match self.find_on(conn, &new.key).await? {
                    Some(task) => (false, task),
                    None => continue, // the racer rolled back: try again
                },
            };
            if created {
                return Ok(Submitted::Created(task));
            }
            if task.input_hash != new.input_hash {
                return Err(Error::KeyConflict { existing: task.id });
            }
            return Ok(Submitted::Existing(task));
        }
        Err(Error::storage(Raced("submit")))
    }

    /// [`TaskStore::claim`] on the caller's connection or transaction.
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
        let attempt_id = AttemptId::new();
        for _ in 0..RACE_RETRIES {
            let Some(row) = sqlx::query(&self.sql.claim)
                .bind(id.as_uuid())
                .bind(attempt_id.as_uuid())
                .bind(interval(request.lease))
                .bind(&request.worker)
                .bind(StopReason::AttemptsExhausted.as_str())
                .bind(StopReason::DeadlineExhausted.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?
            else {
                return Ok(Claim::NotFound);
            };
            let task = row::task(&row).map_err(db)?;
            if row.try_get::<bool, _>("written").map_err(db)? {
                return match (task.status, task.lease_until) {
                    (Status::Running, Some(until)) => {
                        let span = tracing::Span::current();
                        span.record("version", task.version);
                        span.record("attempt_id", tracing::field::display(attempt_id));
                        Ok(Claim::Acquired(Lease::new(
                            task,
                            attempt_id,
                            request.worker,
                            until,
                        )))
                    }
                    _ => Ok(Claim::Failed(task)),
                };
            }
            // Not taken: `task` is this statement's snapshot of the row. An
            // answer (done, busy, backoff) from it holds; "available" means the
            // row changed while the UPDATE waited for its lock: read it again.
            let now: OffsetDateTime = row.try_get("store_now").map_err(db)?;
            if let ClaimRule::Answer(claim) = rules::claim(&task, now) {
                return Ok(claim);
            }
            match self.read_on(conn, id).await? {
                None => return Ok(Claim::NotFound),
                Some((task, now)) => {
                    if let ClaimRule::Answer(claim) = rules::claim(&task, now) {
                        return Ok(claim);
                    }
                }
            }
        }
        Err(Error::storage(Raced("claim")))
    }

    /// [`TaskStore::complete`] on the caller's connection or transaction, so
    /// the application can write the reply into its own tables and complete the
    /// task atomically. The row lock is held until the caller commits.
    ///
    /// One statement that locks the row first, then checks version, status,
    /// lease (on `clock_timestamp()`, read after the lock) and the absence of a
    /// response, and saves: the seed's `BEGIN / SELECT … FOR UPDATE / UPDATE /
    /// COMMIT` decision in one round trip — why it decides identically is
    /// explained in the [module documentation](crate::postgres).
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
        for _ in 0..RACE_RETRIES {
            let row = sqlx::query(&self.sql.complete)
                .bind(lease.task_id().as_uuid())
                .bind(version(&lease))
                .bind(response.as_bytes())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            if let Some(row) = row {
                return Ok(Fenced::Accepted(row::task(&row).map_err(db)?));
            }
            if let Some(rejection) = self.rejection_on(conn, &lease).await? {
                return Ok(Fenced::Rejected(rejection));
            }
        }
        Err(Error::storage(Raced("complete")))
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
        // The policy's decision is pure (reused from `RetryPolicy::plan`); only
        // the deadline comparison needs the store clock and happens in SQL.
        let policy = &lease.task().policy;
        let (stop, delay) = match policy.plan(failure.kind, lease.attempt(), jitter_unit(lease.attempt_id()))
        {
            Plan::Stop(reason) => (Some(stop_message(reason, &failure.message)), Duration::ZERO),
            Plan::RetryAfter(delay) => (None, delay),
        };
        let deadline_message = stop_message(StopReason::DeadlineExhausted, &failure.message);
        for _ in 0..RACE_RETRIES {
            let row = sqlx::query(&self.sql.fail)
                .bind(lease.task_id().as_uuid())
                .bind(version(&lease))
                .bind(stop.as_deref())
                .bind(&failure.message)
                .bind(&deadline_message)
                .bind(interval(delay))
                .bind(AttemptOutcome::Failed(failure.kind).as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            if let Some(row) = row {
                let task = row::task(&row).map_err(db)?;
                return Ok(Fenced::Accepted(match (task.status, task.not_before) {
                    (Status::Pending, Some(not_before)) => Retry::Scheduled {
                        not_before,
                        attempts_left: task.attempts_left(),
                    },
                    _ => Retry::Exhausted(Box::new(task)),
                }));
            }
            if let Some(rejection) = self.rejection_on(conn, &lease).await? {
                return Ok(Fenced::Rejected(rejection));
            }
        }
        Err(Error::storage(Raced("fail")))
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
        for _ in 0..RACE_RETRIES {
            let row = sqlx::query(&self.sql.cancel)
                .bind(id.as_uuid())
                .bind(reason)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db)?;
            if let Some(row) = row {
                return Ok(Fenced::Accepted(row::task(&row).map_err(db)?));
            }
            let (task, _) = self.read_on(conn, id).await?.ok_or(Error::NotFound(id))?;
            match task.status {
                Status::Cancelled => return Ok(Fenced::Accepted(task)),
                Status::Completed => {
                    return Ok(Fenced::Rejected(Rejection::AlreadyCompleted(Box::new(task))));
                }
                Status::Failed => return Ok(Fenced::Rejected(Rejection::NotRunning(Status::Failed))),
                Status::Pending | Status::Running => continue,
            }
        }
        Err(Error::storage(Raced("cancel")))
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
        sqlx::query(&self.sql.get)
            .bind(id.as_uuid())
            .fetch_optional(conn)
            .await
            .map_err(db)?
            .map(|row| row::task(&row).map_err(db))
            .transpose()
    }

    /// Publishes up to `limit` pending handoffs (the transactional outbox):
    /// claims them with `FOR UPDATE SKIP LOCKED` (so several dispatchers share
    /// the work), calls `publish` with each task id in order, and marks the
    /// published ones in the same transaction.
    ///
    /// A crash between publishing and the commit publishes the same task id
    /// again next round: at least once, and every copy points to the same task.
    /// A failed publish stops the round; that handoff stays pending.
    ///
    /// `publish` must return only once the message is *durably* in the queue
    /// (the broker acknowledged it). A task that was never claimed is not
    /// [`due`](TaskStore::due), so a handoff marked published while its message
    /// only sat in process memory would be lost with the process.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let round = store
    ///     .dispatch(100, |task_id| async move {
    ///         // send `task_id` to SQS / Kafka here
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .await?;
    /// println!("published {}", round.published.len());
    /// # Ok(()) }
    /// ```
    pub async fn dispatch<F, Fut, E>(&self, limit: usize, mut publish: F) -> Result<Dispatched<E>>
    where
        F: FnMut(TaskId) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        limits::check_scan_limit(limit)?;
        let span = trace::op("dispatch", None, None, None);
        async move {
            let mut tx = self.pool.begin().await.map_err(db)?;
            let handoffs: Vec<(i64, TaskId)> = sqlx::query(&self.sql.claim_handoffs)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?
                .iter()
                .map(|row| Ok((row.try_get(0)?, TaskId::from_uuid(row.try_get(1)?))))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(db)?;
            let mut marked = Vec::with_capacity(handoffs.len());
            let mut published = Vec::with_capacity(handoffs.len());
            let mut failed = None;
            for (handoff, task_id) in handoffs {
                match publish(task_id).await {
                    Ok(()) => {
                        marked.push(handoff);
                        published.push(task_id);
                    }
                    Err(err) => {
                        failed = Some((task_id, err));
                        break;
                    }
                }
            }
            if !marked.is_empty() {
                sqlx::query(&self.sql.mark_published)
                    .bind(&marked)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
            }
            tx.commit().await.map_err(db)?;
            Ok(Dispatched { published, failed })
        }
        .instrument(span)
        .await
    }

    /// Re-publishes up to `limit` tasks that need a worker again: leases that
    /// expired (a worker crashed) and backoffs that passed (see
    /// [`TaskStore::due`], index-driven). A task stays due until a worker claims
    /// it, so a later round may publish it again: claims make that harmless.
    ///
    /// ```no_run
    /// # async fn f(store: taskfence::PgStore) -> taskfence::Result<()> {
    /// let round = store.dispatch_due(100, |task_id| async move { Ok::<(), std::io::Error>(()) }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn dispatch_due<F, Fut, E>(&self, limit: usize, mut publish: F) -> Result<Dispatched<E>>
    where
        F: FnMut(TaskId) -> Fut + Send,
        Fut: Future<Output = std::result::Result<(), E>> + Send,
        E: Send,
    {
        let due = self.due(limit).await?;
        let mut published = Vec::with_capacity(due.len());
        for task_id in due {
            if let Err(err) = publish(task_id).await {
                return Ok(Dispatched {
                    published,
                    failed: Some((task_id, err)),
                });
            }
            published.push(task_id);
        }
        Ok(Dispatched {
            published,
            failed: None,
        })
    }

    async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>> {
        self.pool.acquire().await.map_err(db)
    }

    async fn find_on(&self, conn: &mut PgConnection, key: &RequestKey) -> Result<Option<Task>> {
        sqlx::query(&self.sql.find)
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
        let Some(row) = sqlx::query(&self.sql.read)
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

    /// Why a fenced write of `lease` matched no row: one read, classified by [`rules::fence`].
    /// `None` means the fence passes now (the caller writes again).
    async fn rejection_on(&self, conn: &mut PgConnection, lease: &Lease) -> Result<Option<Rejection>> {
        let (task, now) = self
            .read_on(conn, lease.task_id())
            .await?
            .ok_or(Error::NotFound(lease.task_id()))?;
        let rejection = rules::fence(&task, lease.version(), now).err();
        if let Some(r) = &rejection {
            tracing::debug!(rejection = %r, "fenced write rejected");
        }
        Ok(rejection)
    }
}

fn version(lease: &Lease) -> i64 {
    i64::try_from(lease.version()).unwrap_or(i64::MAX)
}

#[async_trait]
impl TaskStore for PgStore {
    async fn submit(&self, task: NewTask) -> Result<Submitted> {
        task.validate()?;
        let span = trace::op("submit", None, None, None);
        async move { self.submit_in(&mut *self.acquire().await?, task).await }
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
        async move { self.claim_in(&mut *self.acquire().await?, id, request).await }
            .instrument(span)
            .await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        limits::check_extension(extend_by)?;
        let span = trace::lease_op("renew", lease);
        async move {
            let mut conn = self.acquire().await?;
            for _ in 0..RACE_RETRIES {
                let row = sqlx::query(&self.sql.renew)
                    .bind(lease.task_id().as_uuid())
                    .bind(version(lease))
                    .bind(interval(extend_by))
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db)?;
                if let Some(row) = row {
                    lease.set_expires_at(row.try_get("lease_until").map_err(db)?);
                    return Ok(Fenced::Accepted(()));
                }
                if let Some(rejection) = self.rejection_on(&mut conn, lease).await? {
                    return Ok(Fenced::Rejected(rejection));
                }
            }
            Err(Error::storage(Raced("renew")))
        }
        .instrument(span)
        .await
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        limits::check_response(&response)?;
        let span = trace::lease_op("complete", &lease);
        async move {
            self.complete_in(&mut *self.acquire().await?, lease, response)
                .await
        }
        .instrument(span)
        .await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        failure.validate()?;
        let span = trace::lease_op("fail", &lease);
        async move { self.fail_in(&mut *self.acquire().await?, lease, failure).await }
            .instrument(span)
            .await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        let span = trace::lease_op("release", &lease);
        async move {
            let mut conn = self.acquire().await?;
            for _ in 0..RACE_RETRIES {
                let row = sqlx::query(&self.sql.release)
                    .bind(lease.task_id().as_uuid())
                    .bind(version(&lease))
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db)?;
                if row.is_some() {
                    return Ok(Fenced::Accepted(()));
                }
                if let Some(rejection) = self.rejection_on(&mut conn, &lease).await? {
                    return Ok(Fenced::Rejected(rejection));
                }
            }
            Err(Error::storage(Raced("release")))
        }
        .instrument(span)
        .await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        limits::check_reason(reason)?;
        let span = trace::op("cancel", Some(id), None, None);
        async move { self.cancel_in(&mut *self.acquire().await?, id, reason).await }
            .instrument(span)
            .await
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        limits::check_operation_id(operation_id)?;
        let span = trace::lease_op("record_operation", lease);
        async move {
            let mut conn = self.acquire().await?;
            for _ in 0..RACE_RETRIES {
                let row = sqlx::query(&self.sql.record_operation)
                    .bind(lease.task_id().as_uuid())
                    .bind(version(lease))
                    .bind(operation_id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db)?;
                if row.is_some() {
                    return Ok(Fenced::Accepted(()));
                }
                if let Some(rejection) = self.rejection_on(&mut conn, lease).await? {
                    return Ok(Fenced::Rejected(rejection));
                }
            }
            Err(Error::storage(Raced("record_operation")))
        }
        .instrument(span)
        .await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        let span = trace::op("attempts", Some(id), None, None);
        async move {
            sqlx::query(&self.sql.attempts)
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
            sqlx::query(&self.sql.due)
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
            let done = sqlx::query(&self.sql.purge_expired)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.pool)
                .await
                .map_err(db)?;
            Ok(done.rows_affected())
        }
        .instrument(span)
        .await
    }
}
