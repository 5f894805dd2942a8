//! Every operation of [`PgStore`](super::PgStore) on one connection, input
//! already validated: the pool path (a pooled connection per call) and the
//! caller's connection or transaction ([`OnConnection`](super::OnConnection))
//! run exactly this code.
//!
//! Each happy path is one statement; a refused write (zero rows) costs one
//! more read of the row with the store clock, classified by the same
//! [`rules`] functions every backend uses.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use time::OffsetDateTime;

use crate::backend::rules::{
    self, BeginEffectRule, CancelRule, ClaimRule, FinishEffectRule, LeaseCheck, ReopenRule,
};
use crate::backend::{Plan, new_lease, new_task, renewed};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::{Error, Result};
use crate::inspect::{Counts, Order, Page, Story, TaskQuery};
use crate::policy::{Failure, StopReason};
use crate::store::{
    Attempt, AttemptOutcome, Claim, ClaimNext, ClaimRequest, Fenced, Lease, Rejection, ReopenRequest, Retry,
    Submitted,
};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Status, Task, TaskId};

use super::db;
use super::row::{self, interval, nanos};
use super::sql::{self, ListShape, Sql, Statements};

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

pub(super) async fn submit(sql: &Statements, conn: &mut PgConnection, new: NewTask) -> Result<Submitted> {
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
        if task.input_hash != new.input_hash {
            return Err(Error::KeyConflict { existing: task.id });
        }
        return Ok(Submitted::Existing(task));
    }
    Err(Error::storage(Raced("submit")))
}

pub(super) async fn claim(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    request: ClaimRequest,
) -> Result<Claim> {
    let attempt_id = AttemptId::new();
    // Most claims are a task's first: a statement that writes only an
    // available row holding no attempt and returns nothing otherwise.
    if let Some(row) = claim_row(conn, &sql.claim_fresh, id, attempt_id, &request).await? {
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
            }
        }
        // Available: a retry or a takeover. The full statement moves the
        // replaced attempt to the journal; it leaves the row only if it
        // changed while the statement waited for its lock.
        if let Some(claim) = claim_full(sql, conn, id, attempt_id, &request).await? {
            return Ok(claim);
        }
    }
    Err(Error::storage(Raced("claim")))
}

/// The full claim statement: the claim it decides, or `None` when it left
/// a row its snapshot shows available.
async fn claim_full(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
    attempt_id: AttemptId,
    request: &ClaimRequest,
) -> Result<Option<Claim>> {
    let Some(row) = claim_row(conn, &sql.claim, id, attempt_id, request).await? else {
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

pub(super) async fn complete(
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

pub(super) async fn fail(
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

pub(super) async fn cancel(
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

pub(super) async fn reopen(
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

/// Runs a fenced write of `lease`: `query` builds the statement (again
/// for each try), `accepted` reads the row it returns. Zero rows is not an
/// error: one re-read of the row, classified by [`rules::fence`], says why
/// it was refused; should the fence pass on that read (the row changed
/// between the two), the write is tried again.
async fn fenced_write<'q, T>(
    sql: &Statements,
    conn: &mut PgConnection,
    op: &'static str,
    lease: &Lease,
    query: impl Fn() -> Bound<'q> + Send,
    accepted: impl Fn(PgRow) -> Result<T> + Send,
) -> Result<Fenced<T>> {
    checked_write(sql, conn, op, rules::fence, lease, query, accepted).await
}

/// [`fenced_write`] for a write that `check` decides
/// (a completion: [`rules::accept`]), so the re-read classifies a refusal
/// by the same rule the statement's guard applies.
async fn checked_write<'q, T>(
    sql: &Statements,
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
        if let Some(rejection) = rejection(sql, conn, check, lease).await? {
            return Ok(Fenced::Rejected(rejection));
        }
    }
    Err(Error::storage(Raced(op)))
}

pub(super) async fn get(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Option<Task>> {
    sql.get
        .query()
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|row| row::task(&row).map_err(db))
        .transpose()
}

pub(super) async fn find(
    sql: &Statements,
    conn: &mut PgConnection,
    key: &RequestKey,
) -> Result<Option<Task>> {
    sql.find
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
async fn read(
    sql: &Statements,
    conn: &mut PgConnection,
    id: TaskId,
) -> Result<Option<(Task, OffsetDateTime)>> {
    let Some(row) = sql
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
async fn rejection(
    sql: &Statements,
    conn: &mut PgConnection,
    check: LeaseCheck,
    lease: &Lease,
) -> Result<Option<Rejection>> {
    let (task, now) = read(sql, conn, lease.task_id())
        .await?
        .ok_or(Error::NotFound(lease.task_id()))?;
    let rejection = check(&task, lease.version(), now).err();
    if let Some(r) = &rejection {
        tracing::debug!(rejection = %r, "fenced write rejected");
    }
    Ok(rejection)
}

pub(super) async fn renew(
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
        };
        fenced_write(sql, conn, "renew", lease, query, |row| {
            row.try_get::<OffsetDateTime, _>("lease_until").map_err(db)
        })
        .await?
    };
    Ok(renewed_until.map(|until| renewed(lease, until)))
}

pub(super) async fn release(sql: &Statements, conn: &mut PgConnection, lease: Lease) -> Result<Fenced<()>> {
    let query = || {
        sql.release
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(&lease))
    };
    fenced_write(sql, conn, "release", &lease, query, |_| Ok(())).await
}

pub(super) async fn record_operation(
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
    };
    fenced_write(sql, conn, "record_operation", lease, query, |_| Ok(())).await
}

pub(super) async fn fence(sql: &Statements, conn: &mut PgConnection, lease: &Lease) -> Result<Fenced<()>> {
    let query = || {
        sql.fence
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
    };
    fenced_write(sql, conn, "fence", lease, query, |_| Ok(())).await
}

pub(super) async fn begin_effect(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &Lease,
    name: &str,
) -> Result<Fenced<EffectStart>> {
    effect_step(sql, conn, "begin_effect", lease, name, |recorded, now| {
        Ok(match rules::begin_effect(recorded, lease, name, now) {
            BeginEffectRule::Write { effect, start } => (Some(effect), start),
            BeginEffectRule::Answer(start) => (None, start),
        })
    })
    .await
}

pub(super) async fn finish_effect(
    sql: &Statements,
    conn: &mut PgConnection,
    lease: &Lease,
    name: &str,
    outcome: &EffectOutcome,
) -> Result<Fenced<Effect>> {
    effect_step(sql, conn, "finish_effect", lease, name, |recorded, now| {
        Ok(match rules::finish_effect(recorded, lease, name, outcome, now)? {
            FinishEffectRule::Write(effect) => (Some(effect.clone()), effect),
            FinishEffectRule::Answer(effect) => (None, effect),
        })
    })
    .await
}

/// One step of the effect journal: read the effect's record under the
/// fence, `decide` (a record to store, if any, and the answer), store it
/// conditionally. A refused read is classified by [`rules::fence`]; a write
/// that found the record or the lease changed since the read starts over.
async fn effect_step<T: Send>(
    sql: &Statements,
    conn: &mut PgConnection,
    op: &'static str,
    lease: &Lease,
    name: &str,
    decide: impl Fn(Option<&Effect>, OffsetDateTime) -> Result<(Option<Effect>, T)> + Send,
) -> Result<Fenced<T>> {
    for _ in 0..RACE_RETRIES {
        let read = sql
            .effect_read
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        let Some(read) = read else {
            match rejection(sql, conn, rules::fence, lease).await? {
                Some(rejection) => return Ok(Fenced::Rejected(rejection)),
                None => continue,
            }
        };
        let recorded = row::effect(&read).map_err(db)?;
        let now: OffsetDateTime = read.try_get("store_now").map_err(db)?;
        let (write, answer) = decide(recorded.as_ref(), now)?;
        let Some(effect) = write else {
            return Ok(Fenced::Accepted(answer));
        };
        let written = sql
            .effect_write
            .query()
            .bind(lease.task_id().as_uuid())
            .bind(version(lease))
            .bind(&effect.name)
            .bind(effect.state.as_str())
            .bind(i32::try_from(effect.attempt).unwrap_or(i32::MAX))
            .bind(&effect.reference)
            .bind(&effect.error)
            .bind(i32::try_from(effect.ambiguous).unwrap_or(i32::MAX))
            .bind(effect.created_at)
            .bind(effect.intended_at)
            .bind(effect.settled_at)
            .bind(recorded.as_ref().map(|r| r.state.as_str()))
            .bind(
                recorded
                    .as_ref()
                    .map(|r| i64::try_from(r.version).unwrap_or(i64::MAX)),
            )
            .fetch_optional(&mut *conn)
            .await
            .map_err(db)?;
        if written.is_some() {
            return Ok(Fenced::Accepted(answer));
        }
    }
    Err(Error::storage(Raced(op)))
}

pub(super) async fn effects(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Vec<Effect>> {
    sql.effects
        .query()
        .bind(id.as_uuid())
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .filter_map(|row| row::effect(row).map_err(db).transpose())
        .collect()
}

pub(super) async fn attempts(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Vec<Attempt>> {
    sql.attempts
        .query()
        .bind(id.as_uuid())
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(|row| row::attempt(row).map_err(db))
        .collect()
}

pub(super) async fn due(sql: &Statements, conn: &mut PgConnection, limit: usize) -> Result<Vec<TaskId>> {
    sql.due
        .query()
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?
        .iter()
        .map(|row| row.try_get("id").map(TaskId::from_uuid).map_err(db))
        .collect()
}

pub(super) async fn purge_expired(sql: &Statements, conn: &mut PgConnection, limit: usize) -> Result<u64> {
    let done = sql
        .purge_expired
        .query()
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(done.rows_affected())
}

/// One statement for the whole batch (see `claim_many` in `sql.rs`); a
/// task whose row changed while the statement waited for its lock is
/// decided again on its own.
pub(super) async fn claim_many(
    sql: &Statements,
    conn: &mut PgConnection,
    ids: &[TaskId],
    request: ClaimRequest,
) -> Result<Vec<Claim>> {
    let attempts: Vec<AttemptId> = ids.iter().map(|_| AttemptId::new()).collect();
    let rows = sql
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
            _ => claim(sql, conn, id, request.clone()).await?,
        });
    }
    Ok(claims)
}

/// One statement (see `claim_next` in `sql.rs`): the leases it took, in due
/// order; a task it failed for a spent budget is not among them.
pub(super) async fn claim_next(
    sql: &Statements,
    conn: &mut PgConnection,
    request: ClaimNext,
) -> Result<Vec<Lease>> {
    let attempts: Vec<AttemptId> = (0..request.limit).map(|_| AttemptId::new()).collect();
    let rows = sql
        .claim_next
        .query()
        .bind(i64::try_from(request.limit).unwrap_or(i64::MAX))
        .bind(attempts.iter().map(|a| a.as_uuid()).collect::<Vec<_>>())
        .bind(interval(request.lease))
        .bind(&request.worker)
        .bind(StopReason::AttemptsExhausted.as_str())
        .bind(StopReason::DeadlineExhausted.as_str())
        .bind(&request.operations)
        .bind(&request.scopes)
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in rows {
        let place: i64 = row.try_get("n").map_err(db)?;
        let attempt_id = usize::try_from(place - 1)
            .ok()
            .and_then(|i| attempts.get(i))
            .copied()
            .ok_or_else(|| Error::storage(Raced("claim_next")))?;
        if let Claim::Acquired(lease) =
            written_claim(row::task(&row).map_err(db)?, attempt_id, request.worker.clone())
        {
            leases.push(lease);
        }
    }
    Ok(leases)
}

/// One statement for the batch; the refused leases' rows read once more and
/// classified by [`rules::fence`].
pub(super) async fn renew_many(
    sql: &Statements,
    conn: &mut PgConnection,
    leases: &mut [Lease],
    extend_by: Duration,
) -> Result<Vec<Fenced<()>>> {
    let rows = sql
        .renew_many
        .query()
        .bind(leases.iter().map(|l| l.task_id().as_uuid()).collect::<Vec<_>>())
        .bind(leases.iter().map(version).collect::<Vec<_>>())
        .bind(interval(extend_by))
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut until = HashMap::with_capacity(rows.len());
    for row in rows {
        let id = TaskId::from_uuid(row.try_get("id").map_err(db)?);
        until.insert(id, row.try_get::<OffsetDateTime, _>("lease_until").map_err(db)?);
    }
    let refused: Vec<_> = leases
        .iter()
        .map(Lease::task_id)
        .filter(|id| !until.contains_key(id))
        .map(|id| id.as_uuid())
        .collect();
    let mut reread = read_refused(sql, conn, &refused).await?;
    let mut answers = Vec::with_capacity(leases.len());
    for lease in leases.iter_mut() {
        if let Some(&until) = until.get(&lease.task_id()) {
            renewed(lease, until);
            answers.push(Fenced::Accepted(()));
            continue;
        }
        let row = reread
            .remove(&lease.task_id())
            .ok_or(Error::NotFound(lease.task_id()))?;
        let task = row::task(&row).map_err(db)?;
        let now: OffsetDateTime = row.try_get("store_now").map_err(db)?;
        answers.push(match rules::fence(&task, lease.version(), now) {
            Err(rejection) => Fenced::Rejected(rejection),
            // Acceptable on the re-read: the row changed in between; renew it alone.
            Ok(()) => renew(sql, conn, lease, extend_by).await?,
        });
    }
    Ok(answers)
}

/// One statement for the whole batch (see `complete_many` in `sql.rs`),
/// and one read of the refused rows to say why each was refused.
pub(super) async fn complete_many(
    sql: &Statements,
    conn: &mut PgConnection,
    completions: Vec<(Lease, Response)>,
) -> Result<Vec<Result<Fenced<Task>>>> {
    let ids: Vec<_> = completions.iter().map(|(l, _)| l.task_id().as_uuid()).collect();
    let leases: Vec<_> = completions.iter().map(|(l, _)| l).collect();
    let rows = sql
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
    let mut reread = read_refused(sql, conn, &refused).await?;
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
            Ok(()) => match complete(sql, conn, lease, response).await {
                Err(Error::NotFound(id)) => Err(Error::NotFound(id)),
                other => Ok(other?),
            },
        });
    }
    Ok(out)
}

/// Writes a fresh, unpublished handoff for each of `ids` still pending.
pub(super) async fn redispatch(sql: &Statements, conn: &mut PgConnection, ids: &[TaskId]) -> Result<u64> {
    let done = sql
        .redispatch
        .query()
        .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(done.rows_affected())
}

// Read-only, index-driven statements (plans at 10⁶ rows in
// `docs/POSTGRES.md`): listings are keyset pages on the primary key's order,
// one statement per combination of filters; counting one scope reads that
// scope's index entries, counting all reads every entry of one index.

pub(super) async fn list(sql: &Statements, conn: &mut PgConnection, query: &TaskQuery) -> Result<Page> {
    let shape = ListShape {
        status: query.status.is_some(),
        scope: query.scope.is_some(),
        operation: query.operation.is_some(),
        created_after: query.created_after.is_some(),
        created_before: query.created_before.is_some(),
        oldest_first: query.order == Order::OldestFirst,
    };
    let mut q = sql.list_of(shape).query();
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
        .fetch_all(conn)
        .await
        .map_err(db)?;
    Ok(Page::from_overfetch(super::reads::summaries(&rows)?, query.limit))
}

pub(super) async fn counts(sql: &Statements, conn: &mut PgConnection, scope: Option<&str>) -> Result<Counts> {
    let rows = match scope {
        Some(scope) => sql.counts_scope.query().bind(scope),
        None => sql.counts.query(),
    }
    .fetch_all(conn)
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

pub(super) async fn story(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Option<Story>> {
    sql.story
        .query()
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|row| row::story(&row).map_err(db))
        .transpose()
}

pub(super) async fn stranded(
    sql: &Statements,
    conn: &mut PgConnection,
    older_than: Duration,
    limit: usize,
) -> Result<Vec<Task>> {
    let rows = sql
        .stranded
        .query()
        .bind(interval(older_than))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    tasks(&rows)
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
        (Status::Running, Some(until)) => Claim::Acquired(new_lease(task, attempt_id, worker, until)),
        _ => Claim::Failed(task),
    }
}

/// Rows of a batch statement by task id (with the store clock, when read).
/// The refused rows of a batch with the store clock (`read_many`), by id,
/// to say why each was refused; no round trip when none was.
async fn read_refused(
    sql: &Statements,
    conn: &mut PgConnection,
    refused: &[uuid::Uuid],
) -> Result<HashMap<TaskId, PgRow>> {
    if refused.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sql
        .read_many
        .query()
        .bind(refused)
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    rows_by_id(rows)
}

fn rows_by_id(rows: Vec<PgRow>) -> Result<HashMap<TaskId, PgRow>> {
    rows.into_iter()
        .map(|row| Ok((TaskId::from_uuid(row.try_get("id").map_err(db)?), row)))
        .collect()
}

fn version(lease: &Lease) -> i64 {
    i64::try_from(lease.version()).unwrap_or(i64::MAX)
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
