//! The steps every operation is made of: a task's row read and written
//! whole, an attempt started and ended, and the lease check that guards a
//! fenced write; and [`Writes`], a batch's writes made in a few statements
//! once its decisions are taken.

use sqlx::SqliteConnection;
use time::OffsetDateTime;

use crate::backend::rules::{self, LeaseCheck};
use crate::error::{Error, Result};
use crate::store::{AttemptOutcome, Lease, Rejection};
use crate::task::{AttemptId, Response, Task, TaskId};

use super::super::{db, row, sql};

/// The task's row, if there is one.
pub(crate) async fn load(conn: &mut SqliteConnection, id: TaskId) -> Result<Option<Task>> {
    sqlx::query(sql::TASK)
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|r| row::task(&r))
        .transpose()
        .map_err(db)
}

/// Inserts a new task's row.
pub(crate) async fn insert(conn: &mut SqliteConnection, task: &Task, handoff: bool) -> Result<()> {
    let p = &task.policy;
    sqlx::query(sql::INSERT_TASK)
        .bind(task.id.as_uuid())
        .bind(&task.key.scope)
        .bind(&task.key.operation)
        .bind(&task.key.key)
        .bind(task.input_hash.as_bytes().as_slice())
        .bind(task.payload.as_slice())
        .bind(task.status.as_str())
        .bind(row::int(task.version))
        .bind(i64::from(p.max_attempts))
        .bind(row::nanos(p.initial_backoff))
        .bind(row::nanos(p.max_backoff))
        .bind(p.multiplier)
        .bind(p.jitter)
        .bind(p.deadline.map(row::nanos))
        .bind(row::on_ambiguous_name(p.on_ambiguous))
        .bind(task.acceptance.as_str())
        .bind(row::int(task.budget_base))
        .bind(row::at(task.budget_started_at))
        .bind(row::at_opt(task.lease_until))
        .bind(row::at_opt(task.not_before))
        .bind(task.response.as_ref().map(Response::as_bytes))
        .bind(task.last_error.as_deref())
        .bind(row::at(task.created_at))
        .bind(row::at_opt(task.finished_at))
        .bind(row::at(task.expires_at))
        .bind(task.trace_context.as_ref().map(ToString::to_string))
        .bind(handoff)
        .bind(task.limits.concurrency.as_ref().map(|key| key.name()))
        .bind(task.limits.concurrency.as_ref().map(|key| i64::from(key.limit())))
        .bind(task.limits.bucket.as_deref())
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Writes what a decision changed in the task's row; `response` only by a completion.
pub(crate) async fn save(
    conn: &mut SqliteConnection,
    task: &Task,
    response: Option<&Response>,
) -> Result<()> {
    bind_saved(sqlx::query(sql::SAVE_TASK), task, response)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Binds the 18 values [`sql::SAVE_TASK`] writes (and each row of
/// [`sql::SAVE_TASKS`]), in their order.
fn bind_saved<'q>(
    q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    task: &'q Task,
    response: Option<&'q Response>,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    let p = &task.policy;
    q.bind(task.id.as_uuid())
        .bind(task.status.as_str())
        .bind(row::int(task.version))
        .bind(i64::from(p.max_attempts))
        .bind(row::nanos(p.initial_backoff))
        .bind(row::nanos(p.max_backoff))
        .bind(p.multiplier)
        .bind(p.jitter)
        .bind(p.deadline.map(row::nanos))
        .bind(row::on_ambiguous_name(p.on_ambiguous))
        .bind(row::int(task.budget_base))
        .bind(row::at(task.budget_started_at))
        .bind(row::at_opt(task.lease_until))
        .bind(row::at_opt(task.not_before))
        .bind(task.last_error.as_deref())
        .bind(row::at_opt(task.finished_at))
        .bind(row::at(task.expires_at))
        .bind(response.map(Response::as_bytes))
}

/// Ends the attempt that holds (or held) `version` of the task, if it is
/// still open (version 0: none, nothing to end).
pub(crate) async fn finish_attempt(
    conn: &mut SqliteConnection,
    task: TaskId,
    version: u64,
    outcome: AttemptOutcome,
    now: OffsetDateTime,
    error: Option<&str>,
) -> Result<()> {
    if version == 0 {
        return Ok(());
    }
    sqlx::query(sql::FINISH_ATTEMPT)
        .bind(task.as_uuid())
        .bind(row::int(version))
        .bind(row::at(now))
        .bind(outcome.as_str())
        .bind(error)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// The task `lease` is for, if `check` lets the lease write at `now` and the
/// attempt recorded at its version is its own ([`rules::check_lease`]: a
/// claim rolled back in the caller's transaction leaves a lease whose
/// version is granted again); the rejection otherwise. [`Error::NotFound`] when the task is gone.
pub(crate) async fn checked(
    conn: &mut SqliteConnection,
    rule: LeaseCheck,
    lease: &Lease,
    now: OffsetDateTime,
) -> Result<Result<Task, Rejection>> {
    let (task, recorded) = lease_row(conn, lease).await?;
    Ok(check(rule, task, lease, recorded, now))
}

/// The task `lease` is for, and the id of the attempt recorded at the
/// lease's version, in one read. [`Error::NotFound`] when the task is gone.
pub(crate) async fn lease_row(
    conn: &mut SqliteConnection,
    lease: &Lease,
) -> Result<(Task, Option<AttemptId>)> {
    let row = sqlx::query(sql::TASK_WITH_ATTEMPT)
        .bind(lease.task_id().as_uuid())
        .bind(row::int(lease.version()))
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .ok_or(Error::NotFound(lease.task_id()))?;
    with_attempt(&row).map_err(db)
}

/// A row of [`sql::TASK_WITH_ATTEMPT`] or [`sql::TASKS_WITH_ATTEMPTS`].
pub(crate) fn with_attempt(row: &sqlx::sqlite::SqliteRow) -> Result<(Task, Option<AttemptId>), sqlx::Error> {
    let recorded: Option<uuid::Uuid> = sqlx::Row::try_get(row, "lease_attempt")?;
    Ok((row::task(row)?, recorded.map(AttemptId::from_uuid)))
}

/// `task` if `rule` lets `lease` write at `now` and `recorded` (the attempt
/// id at the lease's version) is the lease's own; the rejection otherwise.
pub(crate) fn check(
    rule: LeaseCheck,
    task: Task,
    lease: &Lease,
    recorded: Option<AttemptId>,
    now: OffsetDateTime,
) -> Result<Task, Rejection> {
    match rules::check_lease(rule, &task, lease, recorded, now) {
        Ok(()) => Ok(task),
        Err(rejection) => {
            tracing::debug!(%rejection, "fenced write rejected");
            Err(rejection)
        }
    }
}

/// The writes of one or more decisions, made together by [`flush`](Self::flush):
/// each task's row as the last decision left it, the attempts started,
/// ended and completed. A batch (`claim_next`, `complete_many`) decides
/// every item on the rows it read, keeping each decided task as it now is,
/// then writes them all in a handful of statements instead of three or four
/// per item: the same rows end up written as item by item.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    /// Each task once, as it now is; the response saved by a completion.
    rows: Vec<(Task, Option<Response>)>,
    started: Vec<(TaskId, u32, AttemptId, String)>,
    ended: Vec<(TaskId, u64, AttemptOutcome, Option<String>)>,
    completed: Vec<(TaskId, u64)>,
    /// Each rate bucket's new schedule, once, the last a claim took.
    buckets: Vec<(String, OffsetDateTime)>,
}

/// Rows per statement: well under SQLite's 32,766 bound parameters with
/// the widest row (18 columns).
pub(crate) const ROWS_PER_STATEMENT: usize = 64;

impl Writes {
    /// The task's row to write as `task` is now (`response` by a completion).
    pub(crate) fn save(&mut self, task: &Task, response: Option<&Response>) {
        match self.rows.iter_mut().find(|(t, _)| t.id == task.id) {
            Some(row) => {
                let response = response.cloned().or(row.1.take());
                *row = (task.clone(), response);
            }
            None => self.rows.push((task.clone(), response.cloned())),
        }
    }

    /// Attempt `number` of the task started by `worker`.
    pub(crate) fn start_attempt(&mut self, task: TaskId, number: u32, id: AttemptId, worker: &str) {
        self.started.push((task, number, id, worker.to_owned()));
    }

    /// The attempt that holds (or held) `version` ended, if still open (version 0: none).
    pub(crate) fn finish_attempt(
        &mut self,
        task: TaskId,
        version: u64,
        outcome: AttemptOutcome,
        error: Option<&str>,
    ) {
        if version > 0 {
            self.ended
                .push((task, version, outcome, error.map(str::to_owned)));
        }
    }

    /// The rate bucket `name`'s schedule after a claim took a token.
    pub(crate) fn bucket(&mut self, name: &str, schedule: OffsetDateTime) {
        match self.buckets.iter_mut().find(|(held, _)| held == name) {
            Some(held) => held.1 = schedule,
            None => self.buckets.push((name.to_owned(), schedule)),
        }
    }

    /// The attempt that holds `version` completed.
    pub(crate) fn complete_attempt(&mut self, task: TaskId, version: u64) {
        self.completed.push((task, version));
    }

    /// Makes every write, at `now`: attempts started, ended, completed (in
    /// that order, as one decision makes them), then the tasks' rows, then
    /// the buckets' schedules.
    pub(crate) async fn flush(self, conn: &mut SqliteConnection, now: OffsetDateTime) -> Result<()> {
        let at = row::at(now);
        for chunk in self.started.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(many(sql::INSERT_ATTEMPTS, 5, chunk.len())));
            for (task, number, id, worker) in chunk {
                q = q
                    .bind(task.as_uuid())
                    .bind(i64::from(*number))
                    .bind(id.as_uuid())
                    .bind(worker.as_str())
                    .bind(at);
            }
            q.execute(&mut *conn).await.map_err(db)?;
        }
        for chunk in self.ended.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(many(sql::FINISH_ATTEMPTS, 5, chunk.len())));
            for (task, version, outcome, error) in chunk {
                q = q
                    .bind(task.as_uuid())
                    .bind(row::int(*version))
                    .bind(at)
                    .bind(outcome.as_str())
                    .bind(error.as_deref());
            }
            q.execute(&mut *conn).await.map_err(db)?;
        }
        for chunk in self.completed.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(many(sql::COMPLETE_ATTEMPTS, 3, chunk.len())));
            for (task, version) in chunk {
                q = q.bind(task.as_uuid()).bind(row::int(*version)).bind(at);
            }
            q.execute(&mut *conn).await.map_err(db)?;
        }
        for chunk in self.rows.chunks(ROWS_PER_STATEMENT) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(many(sql::SAVE_TASKS, 18, chunk.len())));
            for (task, response) in chunk {
                q = bind_saved(q, task, response.as_ref());
            }
            q.execute(&mut *conn).await.map_err(db)?;
        }
        for (name, schedule) in &self.buckets {
            sqlx::query(sql::SET_SCHEDULE)
                .bind(name.as_str())
                .bind(row::at(*schedule))
                .execute(&mut *conn)
                .await
                .map_err(db)?;
        }
        Ok(())
    }
}

/// `statement` with its `{rows}` made `n` rows of `width` placeholders.
fn many(statement: &str, width: usize, n: usize) -> String {
    let row = format!("({})", vec!["?"; width].join(", "));
    statement.replace("{rows}", &vec![row.as_str(); n].join(", "))
}
