//! One task's writes, each decided by [`rules`] on the row read under the
//! write lock, then written.

use std::time::Duration;

use sqlx::SqliteConnection;
use time::OffsetDateTime;

use crate::backend::rules::{self, CancelRule, ClaimRule, ReopenRule, Work};
use crate::backend::{new_lease, new_task, renewed};
use crate::error::{Error, InvalidInput, Result};
use crate::policy::Failure;
use crate::store::{AttemptOutcome, Claim, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{AttemptId, NewTask, Response, Status, Task, TaskId};

use super::super::{db, row, sql};
use super::limits::Limits;
use super::row_io::{Writes, check, checked, finish_attempt, insert, lease_row, load, save};

/// Submit: the existing task for the key (or a conflict), else the new task
/// and, unless it goes without one, its handoff: in one transaction.
pub(crate) async fn submit(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    new: NewTask,
) -> Result<Submitted> {
    if let Some(existing) = super::read::find(conn, &new.key).await? {
        if existing.input_hash != new.input_hash {
            return Err(Error::KeyConflict {
                existing: existing.id,
            });
        }
        return Ok(Submitted::Existing(existing));
    }
    if let Some(bucket) = &new.limits.bucket
        && !super::limits::bucket_defined(conn, bucket).await?
    {
        return Err(InvalidInput::UnknownBucket {
            bucket: bucket.clone(),
        }
        .into());
    }
    let handoff = new.handoff;
    let expires_at = now + new.retention;
    let task = new_task(TaskId::new(), new, now, expires_at);
    tracing::Span::current().record("task_id", tracing::field::display(task.id));
    insert(conn, &task, handoff).await?;
    if handoff {
        sqlx::query(sql::INSERT_HANDOFF)
            .bind(task.id.as_uuid())
            .bind(row::at(now))
            .execute(&mut *conn)
            .await
            .map_err(db)?;
    }
    Ok(Submitted::Created(task))
}

/// [`rules::claim`] of task `id` at `now`, applied within the task's
/// limits: the claim of `claim` and `claim_many`.
pub(crate) async fn claim(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    id: TaskId,
    request: &ClaimRequest,
) -> Result<Claim> {
    let Some(task) = load(conn, id).await? else {
        return Ok(Claim::NotFound);
    };
    let mut writes = Writes::default();
    let mut limits = Limits::default();
    let claim = claim_task(conn, now, task, request, &mut writes, &mut limits).await?;
    writes.flush(conn, now).await?;
    Ok(claim)
}

/// [`rules::claim`] of `task` (read in this transaction) at `now`, within
/// its limits: what the limits are decided on read first (unless `limits`
/// holds it already) when the claim would start work, then
/// [`decide_claim`]. `claim` and `claim_next` decide with it.
pub(crate) async fn claim_task(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    task: Task,
    request: &ClaimRequest,
    writes: &mut Writes,
    limits: &mut Limits,
) -> Result<Claim> {
    if !task.limits.is_none() && matches!(rules::claim(&task, now), ClaimRule::Take) {
        limits.prepare(conn, writes, &task, now).await?;
    }
    Ok(decide_claim(now, task, request, writes, limits))
}

/// [`rules::claim`] of `task` (read in this transaction) at `now`: the
/// answer, and what it writes added to `writes`. A claim that would start
/// work is then decided within the task's limits
/// ([`rules::within_limits`], on what `limits` read): refused, it answers
/// [`Claim::Throttled`] and writes nothing; granted, the bucket's new
/// schedule is written with it.
pub(crate) fn decide_claim(
    now: OffsetDateTime,
    mut task: Task,
    request: &ClaimRequest,
    writes: &mut Writes,
    limits: &mut Limits,
) -> Claim {
    let id = task.id;
    let previous = task.version;
    match rules::claim(&task, now) {
        ClaimRule::Answer(claim) => claim,
        ClaimRule::Exhaust(reason) => {
            writes.finish_attempt(id, previous, AttemptOutcome::Expired, None);
            rules::terminal(&mut task, Status::Failed, now, Some(reason.as_str().to_owned()));
            writes.save(&task, None);
            limits.ended(&task);
            Claim::Failed(task)
        }
        ClaimRule::Take => {
            let schedule = match limits.decide(&task, now) {
                Ok(schedule) => schedule,
                Err(why) => return Claim::Throttled(why),
            };
            limits.taken(&task, schedule, writes);
            writes.finish_attempt(id, previous, AttemptOutcome::Expired, None);
            let expires_at = now + request.lease_duration;
            rules::taken(&mut task, expires_at);
            writes.save(&task, None);
            let attempt_id = AttemptId::new();
            writes.start_attempt(id, task.attempts(), attempt_id, &request.worker);
            let span = tracing::Span::current();
            span.record("version", task.version);
            span.record("attempt_id", tracing::field::display(attempt_id));
            Claim::Acquired(new_lease(task, attempt_id, request.worker.clone(), expires_at))
        }
    }
}

/// Renew under the fence: the lease now runs until `now + extend_by`.
pub(crate) async fn renew(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &mut Lease,
    extend_by: Duration,
) -> Result<Fenced<()>> {
    let mut task = match checked(conn, rules::fence, lease, now).await? {
        Ok(task) => task,
        Err(rejection) => return Ok(Fenced::Rejected(rejection)),
    };
    let until = now + extend_by;
    task.lease_until = Some(until);
    save(conn, &task, None).await?;
    renewed(lease, until);
    Ok(Fenced::Accepted(()))
}

/// Complete under the task's acceptance rule: the response saved once.
pub(crate) async fn complete(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    response: Response,
) -> Result<Fenced<Task>> {
    let (task, recorded) = lease_row(conn, lease).await?;
    let mut writes = Writes::default();
    let fenced = decide_complete(now, task, recorded, lease, response, &mut writes);
    writes.flush(conn, now).await?;
    Ok(fenced)
}

/// The completion by `lease` of `task` (read in this transaction, with the
/// attempt id `recorded` at the lease's version) at `now`: the answer, and
/// what it writes added to `writes`. `complete` and `complete_many` decide
/// with it.
pub(crate) fn decide_complete(
    now: OffsetDateTime,
    task: Task,
    recorded: Option<AttemptId>,
    lease: &Lease,
    response: Response,
    writes: &mut Writes,
) -> Fenced<Task> {
    let mut task = match check(rules::accept, task, lease, recorded, now) {
        Ok(task) => task,
        Err(rejection) => return Fenced::Rejected(rejection),
    };
    let id = lease.task_id();
    if task.version != lease.version() {
        // First valid answer from an earlier attempt: the current one is overtaken.
        writes.finish_attempt(id, task.version, AttemptOutcome::Overtaken, None);
    }
    writes.complete_attempt(id, lease.version());
    rules::terminal(&mut task, Status::Completed, now, None);
    writes.save(&task, Some(&response));
    task.response = Some(response);
    Fenced::Accepted(task)
}

/// Fail under the fence: a retry after the backoff, or the task failed for good.
pub(crate) async fn fail(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    failure: Failure,
) -> Result<Fenced<Retry>> {
    let mut task = match checked(conn, rules::fence, lease, now).await? {
        Ok(task) => task,
        Err(rejection) => return Ok(Fenced::Rejected(rejection)),
    };
    let id = lease.task_id();
    finish_attempt(
        conn,
        id,
        lease.version(),
        AttemptOutcome::Failed(failure.kind),
        now,
        Some(&failure.message),
    )
    .await?;
    let retry = match rules::after_failure(&task, lease.attempt_id(), &failure, now) {
        Ok(not_before) => {
            rules::retrying(&mut task, not_before, failure.message);
            Retry::Scheduled {
                not_before,
                attempts_left: task.attempts_left(),
            }
        }
        Err(reason) => {
            rules::terminal(
                &mut task,
                Status::Failed,
                now,
                Some(reason.message(&failure.message)),
            );
            Retry::Exhausted(Box::new(task.clone()))
        }
    };
    save(conn, &task, None).await?;
    Ok(Fenced::Accepted(retry))
}

/// Release under the fence by [`rules::release`]: pending and due again now;
/// the attempt stays counted when the work began, and is refunded when it
/// never did ([`Work::NotStarted`]).
pub(crate) async fn release(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    work: Work,
) -> Result<Fenced<()>> {
    let task = match checked(conn, rules::fence, lease, now).await? {
        Ok(task) => task,
        Err(rejection) => return Ok(Fenced::Rejected(rejection)),
    };
    let released = match rules::release(&task, lease.version(), now, work) {
        Ok(released) => released,
        Err(rejection) => return Ok(Fenced::Rejected(rejection)),
    };
    finish_attempt(conn, lease.task_id(), lease.version(), work.outcome(), now, None).await?;
    save(conn, &released, None).await?;
    Ok(Fenced::Accepted(()))
}

/// Cancel by [`rules::cancel`]: the running attempt closed, the task cancelled.
pub(crate) async fn cancel(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    id: TaskId,
    reason: &str,
) -> Result<Fenced<Task>> {
    let mut task = load(conn, id).await?.ok_or(Error::NotFound(id))?;
    match rules::cancel(&task) {
        CancelRule::Answer(answer) => Ok(answer),
        CancelRule::Cancel => {
            finish_attempt(conn, id, task.version, AttemptOutcome::Cancelled, now, None).await?;
            rules::terminal(&mut task, Status::Cancelled, now, Some(reason.to_owned()));
            save(conn, &task, None).await?;
            Ok(Fenced::Accepted(task))
        }
    }
}

/// Records the provider's operation id on the lease's attempt, under the fence.
pub(crate) async fn record_operation(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
    operation_id: &str,
) -> Result<Fenced<()>> {
    if let Err(rejection) = checked(conn, rules::fence, lease, now).await? {
        return Ok(Fenced::Rejected(rejection));
    }
    sqlx::query(sql::RECORD_OPERATION)
        .bind(lease.task_id().as_uuid())
        .bind(lease.attempt_id().as_uuid())
        .bind(operation_id)
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(Fenced::Accepted(()))
}

/// The fence alone: whether `lease` may write now. In the caller's
/// transaction, which holds SQLite's write lock from its first write (or
/// from `BEGIN IMMEDIATE`) to its end, nothing can change the task before
/// the commit.
pub(crate) async fn fence(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    lease: &Lease,
) -> Result<Fenced<()>> {
    Ok(match checked(conn, rules::fence, lease, now).await? {
        Ok(_) => Fenced::Accepted(()),
        Err(rejection) => Fenced::Rejected(rejection),
    })
}

/// Reopen by [`rules::reopen`] and [`rules::reopened`]: the reopening
/// recorded, and a fresh handoff for a task that goes out through the outbox.
pub(crate) async fn reopen(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    id: TaskId,
    request: ReopenRequest,
) -> Result<Fenced<Task>> {
    let mut task = load(conn, id).await?.ok_or(Error::NotFound(id))?;
    if let ReopenRule::Answer(rejection) = rules::reopen(&task) {
        return Ok(Fenced::Rejected(rejection));
    }
    let (from, version, policy) = (task.status, task.version, request.policy_for(&task.policy));
    sqlx::query(sql::INSERT_REOPENING)
        .bind(id.as_uuid())
        .bind(row::at(now))
        .bind(&request.by)
        .bind(&request.reason)
        .bind(from.as_str())
        .bind(row::int(version))
        .execute(&mut *conn)
        .await
        .map_err(db)?;
    rules::reopened(&mut task, now, policy);
    save(conn, &task, None).await?;
    let handoff: bool = sqlx::query_scalar(sql::TASK_HANDOFF)
        .bind(id.as_uuid())
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if handoff {
        sqlx::query(sql::INSERT_HANDOFF)
            .bind(id.as_uuid())
            .bind(row::at(now))
            .execute(&mut *conn)
            .await
            .map_err(db)?;
    }
    Ok(Fenced::Accepted(task))
}
