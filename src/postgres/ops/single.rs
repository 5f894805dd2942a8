//! One task's writes: submit, claim, complete, fail, cancel, reopen, renew,
//! release, record_operation and fence; each happy path one statement.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use time::OffsetDateTime;

use crate::backend::rules::{self, CancelRule, ClaimRule, ReopenRule, Work};
use crate::backend::{Plan, new_lease, new_task, renewed};
use crate::error::{Error, Result};
use crate::policy::{Failure, StopReason};
use crate::store::{AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{AttemptId, NewTask, Response, Status, Task, TaskId};

use super::fenced::{RACE_RETRIES, Raced, checked_write, fenced_write, read, version};
use super::read::{find, get};
use crate::postgres::db;
use crate::postgres::row::{self, interval, nanos};
use crate::postgres::sql::{self, Sql, Statements};

/// What a completion statement returns: the whole task (`complete`), or the
/// row's version and finish instant (`complete_current`, whose task is the
/// lease's with what the completion wrote).
enum Completion {
    Task(Box<Task>),
    At(i64, OffsetDateTime),
}

pub(crate) async fn submit(sql: &Statements, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
    if new.limits.is_none() {
        submit_row(sql, conn, new).await
    } else {
        super::limits::submit(sql, conn, new).await
    }
}

/// The submit statement: `new` created, or the task holding its key.
pub(super) async fn submit_row(sql: &Statements, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
    let id = TaskId::new();
    let deadline = new.policy.deadline;
    for _ in 0..RACE_RETRIES {
        let row = sql
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
            .bind(new.handoff)
            .bind(new.trace_context.as_ref().map(ToString::to_string))
            .bind(new.limits.concurrency.as_ref().map(|key| key.name()))
            .bind(
                new.limits
                    .concurrency
                    .as_ref()
                    .map(|key| i32::try_from(key.limit()).unwrap_or(i32::MAX)),
            )
            .bind(new.limits.bucket.as_deref())
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        let task = match row {
            Some(row) if row.try_get::<bool, _>("created").map_err(db)? => {
                let created_at = row.try_get("created_at").map_err(db)?;
                let expires_at = row.try_get("expires_at").map_err(db)?;
                tracing::Span::current().record("task_id", tracing::field::display(id));
                return Ok(Submitted::Created(new_task(id, new, created_at, expires_at)));
            }
            Some(row) => row::task(&row).map_err(db)?,
            // A racing submit of the same key committed after this
            // statement's snapshot: a fresh read sees it.
            None => match find(sql, conn, &new.key).await? {
                Some(task) => task,
                None => continue, // the racer rolled back: try again
            },
        };
        return found(task, &new);
    }
    Err(Error::storage(Raced("submit")))
}

/// The answer to a submission whose key is taken by `task`: that task when
/// the inputs match, a key conflict naming it otherwise.
pub(super) fn found(task: Task, new: &NewTask) -> Result<Submitted> {
    if task.input_hash != new.input_hash {
        return Err(Error::KeyConflict { existing: task.id });
    }
    Ok(Submitted::Existing(task))
}

pub(crate) async fn claim(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    request: ClaimRequest,
) -> Result<Claim> {
    let attempt_id = AttemptId::new();
    // Most claims are a task's first: a statement that writes only an
    // available row holding no attempt and naming no limit, and returns
    // nothing otherwise.
    if let Some(row) = claim_row(conn, &sql.claim_fresh, id, attempt_id, &request, false).await? {
        return taken(&row, attempt_id, &request);
    }
    for _ in 0..RACE_RETRIES {
        // A read answers a duplicate delivery (busy, done, backing off)
        // without a row lock, so it never queues behind the holder.
        match read(sql, conn, id).await? {
            None => return Ok(Claim::NotFound),
            Some((task, now)) => {
                if let ClaimRule::Answer(claim) = rules::claim(&task, now) {
                    return Ok(claim);
                }
                if !task.limits.is_none() {
                    return super::limits::claim(sql, conn, id, &task.limits, &request).await;
                }
            }
        }
        // Available: a retry or a takeover. The full statement moves the
        // replaced attempt to the journal; it leaves the row only if it
        // changed while the statement waited for its lock.
        if let Some(claim) = claim_full(sql, conn, id, attempt_id, &request, false).await? {
            return Ok(claim);
        }
    }
    Err(Error::storage(Raced("claim")))
}

/// The full claim statement of a task whose limits are decided (under
/// their locks, by `ops::limits`): the claim it decides, or `None` when it
/// left a row its snapshot shows available.
pub(super) async fn claim_full_decided(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    attempt_id: AttemptId,
    request: &ClaimRequest,
) -> Result<Option<Claim>> {
    claim_full(sql, conn, id, attempt_id, request, true).await
}

/// The full claim statement: the claim it decides, or `None` when it left
/// a row its snapshot shows available. `decided`: the task's limits are
/// decided (otherwise a task naming one is left alone).
async fn claim_full(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    attempt_id: AttemptId,
    request: &ClaimRequest,
    decided: bool,
) -> Result<Option<Claim>> {
    let Some(row) = claim_row(conn, &sql.claim, id, attempt_id, request, decided).await? else {
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

/// Runs a claim statement (both take the same parameters); `decided`: the
/// task's limits are decided, so a task naming one may be taken.
async fn claim_row(
    conn: &mut PgConnection,
    sql: &Sql,
    id: TaskId,
    attempt_id: AttemptId,
    request: &ClaimRequest,
    decided: bool,
) -> Result<Option<PgRow>> {
    sql.query()
        .bind(id.as_uuid())
        .bind(attempt_id.as_uuid())
        .bind(interval(request.lease_duration))
        .bind(&request.worker)
        .bind(StopReason::AttemptsExhausted.as_str())
        .bind(StopReason::DeadlineExhausted.as_str())
        .bind(decided)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db)
}

pub(crate) async fn complete(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: Lease,
    response: Response,
) -> Result<Fenced<Task>> {
    let current = sql::current_only(&[&lease]);
    let statement = if current {
        &sql.complete_current
    } else {
        &sql.complete
    };
    let query = || {
        statement
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(&lease))
            .bind(response.as_bytes())
            .bind(lease.attempt_id().as_uuid())
    };
    let done = checked_write(sql, conn, "complete", rules::accept, &lease, query, |row| {
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
        Fenced::Accepted(Completion::At(..)) => match get(sql, conn, lease.task_id()).await? {
            Some(task) => Fenced::Accepted(task),
            None => return Err(Error::storage(Raced("complete"))),
        },
    })
}

pub(crate) async fn fail(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: Lease,
    failure: Failure,
) -> Result<Fenced<Retry>> {
    // The policy's decision is pure (`rules::plan`); only the deadline
    // comparison needs the store clock and happens in SQL.
    let (stop, delay) = match rules::plan(lease.task(), lease.attempt_id(), &failure) {
        Plan::Stop(reason) => (Some(reason.message(&failure.message)), Duration::ZERO),
        Plan::RetryAfter(delay) => (None, delay),
    };
    let deadline_message = StopReason::DeadlineExhausted.message(&failure.message);
    let query = || {
        sql.fail
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(&lease))
            .bind(stop.as_deref())
            .bind(&failure.message)
            .bind(&deadline_message)
            .bind(interval(delay))
            .bind(AttemptOutcome::Failed(failure.kind).as_str())
            .bind(lease.attempt_id().as_uuid())
    };
    fenced_write(sql, conn, "fail", &lease, query, |row| {
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

pub(crate) async fn cancel(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    reason: &str,
) -> Result<Fenced<Task>> {
    for _ in 0..RACE_RETRIES {
        let row = sql
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
        let (task, _) = read(sql, conn, id).await?.ok_or(Error::NotFound(id))?;
        match rules::cancel(&task) {
            CancelRule::Answer(answer) => return Ok(answer),
            CancelRule::Cancel => continue, // it became live again between write and read
        }
    }
    Err(Error::storage(Raced("cancel")))
}

pub(crate) async fn reopen(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    request: ReopenRequest,
) -> Result<Fenced<Task>> {
    // Without a new policy the flag is false and the stored one stays;
    // the bound values are then ignored.
    let policy = request.policy.unwrap_or_default();
    for _ in 0..RACE_RETRIES {
        let row = sql
            .reopen
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
            .bind(request.max_attempts.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        if let Some(row) = row {
            return Ok(Fenced::Accepted(row::task(&row).map_err(db)?));
        }
        let (task, _) = read(sql, conn, id).await?.ok_or(Error::NotFound(id))?;
        match rules::reopen(&task) {
            ReopenRule::Answer(rejection) => {
                tracing::debug!(%rejection, "reopening rejected");
                return Ok(Fenced::Rejected(rejection));
            }
            ReopenRule::Reopen => continue, // it became terminal between write and read
        }
    }
    Err(Error::storage(Raced("reopen")))
}

pub(crate) async fn renew(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &mut Lease,
    extend_by: Duration,
) -> Result<Fenced<()>> {
    let renewed_until = {
        let lease = &*lease;
        let query = || {
            sql.renew
                .query()
                .bind(lease.task_id().as_uuid())
                .bind(version(lease))
                .bind(interval(extend_by))
                .bind(lease.attempt_id().as_uuid())
        };
        fenced_write(sql, conn, "renew", lease, query, |row| {
            row.try_get::<OffsetDateTime, _>("lease_until").map_err(db)
        })
        .await?
    };
    Ok(renewed_until.map(|until| renewed(lease, until)))
}

/// A release as [`rules::release`](crate::backend::rules::release) decides
/// it: the statement's guard is the fence, `work` says the outcome and the
/// refund it writes.
pub(crate) async fn release(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: Lease,
    work: Work,
) -> Result<Fenced<()>> {
    let refund = i64::try_from(work.refund()).expect("a refund is 0 or 1");
    let query = || {
        sql.release
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(&lease))
            .bind(work.outcome().as_str())
            .bind(refund)
            .bind(lease.attempt_id().as_uuid())
    };
    fenced_write(sql, conn, "release", &lease, query, |_| Ok(())).await
}

pub(crate) async fn record_operation(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &Lease,
    operation_id: &str,
) -> Result<Fenced<()>> {
    let query = || {
        sql.record_operation
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(operation_id)
            .bind(lease.attempt_id().as_uuid())
    };
    fenced_write(sql, conn, "record_operation", lease, query, |_| Ok(())).await
}

pub(crate) async fn fence(sql: &Statements, conn: &mut PgConnection, lease: &Lease) -> Result<Fenced<()>> {
    let query = || {
        sql.fence
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(lease.attempt_id().as_uuid())
    };
    fenced_write(sql, conn, "fence", lease, query, |_| Ok(())).await
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
pub(super) fn written_claim(task: Task, attempt_id: AttemptId, worker: String) -> Claim {
    match (task.status, task.lease_until) {
        (Status::Running, Some(until)) => Claim::Acquired(new_lease(task, attempt_id, worker, until)),
        _ => Claim::Failed(task),
    }
}
