//! The steps every operation is made of: a task's row read and written
//! whole, an attempt started and ended, and the lease check that guards a
//! fenced write.

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
    let p = &task.policy;
    sqlx::query(sql::SAVE_TASK)
        .bind(task.id.as_uuid())
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
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
}

/// Starts attempt `number` of the task.
pub(crate) async fn start_attempt(
    conn: &mut SqliteConnection,
    task: TaskId,
    number: u32,
    id: AttemptId,
    worker: &str,
    now: OffsetDateTime,
) -> Result<()> {
    sqlx::query(sql::INSERT_ATTEMPT)
        .bind(task.as_uuid())
        .bind(i64::from(number))
        .bind(id.as_uuid())
        .bind(worker)
        .bind(row::at(now))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(())
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

/// Marks the attempt that holds `version` completed at `now`.
pub(crate) async fn complete_attempt(
    conn: &mut SqliteConnection,
    task: TaskId,
    version: u64,
    now: OffsetDateTime,
) -> Result<()> {
    sqlx::query(sql::COMPLETE_ATTEMPT)
        .bind(task.as_uuid())
        .bind(row::int(version))
        .bind(row::at(now))
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
    check: LeaseCheck,
    lease: &Lease,
    now: OffsetDateTime,
) -> Result<Result<Task, Rejection>> {
    let task = load(conn, lease.task_id())
        .await?
        .ok_or(Error::NotFound(lease.task_id()))?;
    let recorded: Option<uuid::Uuid> = sqlx::query_scalar(sql::ATTEMPT_ID)
        .bind(lease.task_id().as_uuid())
        .bind(row::int(lease.version()))
        .fetch_optional(conn)
        .await
        .map_err(db)?;
    let recorded = recorded.map(AttemptId::from_uuid);
    Ok(match rules::check_lease(check, &task, lease, recorded, now) {
        Ok(()) => Ok(task),
        Err(rejection) => {
            tracing::debug!(%rejection, "fenced write rejected");
            Err(rejection)
        }
    })
}
