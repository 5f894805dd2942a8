//! Batches: one statement for the whole batch, one read of the refused rows;
//! a task whose row changed meanwhile is decided again on its own.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use time::OffsetDateTime;

use crate::backend::renewed;
use crate::backend::rules::{self, ClaimRule};
use crate::backend::{new_task, submission_answer};
use crate::error::{Error, Result};
use crate::policy::StopReason;
use crate::store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease, Submitted};
use crate::task::{AttemptId, NewTask, RequestKey, Response, Task, TaskId};

use super::fenced::{Raced, version};
use super::single::{claim, complete, found, renew, submit, written_claim};
use crate::postgres::db;
use crate::postgres::row::{self, interval, nanos};
use crate::postgres::sql::Statements;

/// One statement for the whole batch (see `claim_many` in `sql`); a
/// task whose row changed while the statement waited for its lock is
/// decided again on its own.
pub(crate) async fn claim_many(
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
        .bind(interval(request.lease_duration))
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

/// One statement for a batch of distinct keys (see `submit_many` in
/// `sql.rs`). A key repeated in the batch goes in a later statement, one
/// per repetition, so it is decided as submits in input order would be:
/// the later one finds the task the earlier one created. A place the
/// statement left without a row (a racing insert committed after its
/// snapshot) is submitted alone. A batch holding a task that names a limit
/// is submitted one task at a time, in order, as `submit` submits each.
pub(crate) async fn submit_many(
    sql: &Statements,
    conn: &mut PgConnection,
    tasks: Vec<NewTask>,
) -> Result<Vec<Result<Submitted>>> {
    if tasks.iter().any(|task| !task.limits.is_none()) {
        let mut answers = Vec::with_capacity(tasks.len());
        for task in tasks {
            answers.push(submission_answer(submit(sql, conn, task).await)?);
        }
        return Ok(answers);
    }
    let mut answers: Vec<Option<Result<Submitted>>> = (0..tasks.len()).map(|_| None).collect();
    let mut pending: Vec<(usize, NewTask)> = tasks.into_iter().enumerate().collect();
    while !pending.is_empty() {
        let mut seen: HashSet<RequestKey> = HashSet::with_capacity(pending.len());
        let (round, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(_, task)| seen.insert(task.key.clone()));
        pending = later;
        for (place, answer) in submit_round(sql, conn, round).await? {
            answers[place] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|answer| answer.ok_or_else(|| Error::storage(Raced("submit_many"))))
        .collect()
}

/// One `submit_many` statement for submissions of distinct keys, with each
/// one's place in the batch; the answers by place.
async fn submit_round(
    sql: &Statements,
    conn: &mut PgConnection,
    round: Vec<(usize, NewTask)>,
) -> Result<Vec<(usize, Result<Submitted>)>> {
    let ids: Vec<TaskId> = round.iter().map(|_| TaskId::new()).collect();
    let news = || round.iter().map(|(_, new)| new);
    let rows = sql
        .submit_many
        .query()
        .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
        .bind(news().map(|n| n.key.scope.as_str()).collect::<Vec<_>>())
        .bind(news().map(|n| n.key.operation.as_str()).collect::<Vec<_>>())
        .bind(news().map(|n| n.key.key.as_str()).collect::<Vec<_>>())
        .bind(news().map(|n| &n.input_hash.as_bytes()[..]).collect::<Vec<_>>())
        .bind(news().map(|n| n.payload.as_slice()).collect::<Vec<_>>())
        .bind(
            news()
                .map(|n| i32::try_from(n.policy.max_attempts).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .bind(
            news()
                .map(|n| nanos(n.policy.initial_backoff))
                .collect::<Vec<_>>(),
        )
        .bind(news().map(|n| nanos(n.policy.max_backoff)).collect::<Vec<_>>())
        .bind(news().map(|n| n.policy.multiplier).collect::<Vec<_>>())
        .bind(news().map(|n| n.policy.jitter).collect::<Vec<_>>())
        .bind(news().map(|n| n.policy.deadline.map(nanos)).collect::<Vec<_>>())
        .bind(
            news()
                .map(|n| row::on_ambiguous_name(n.policy.on_ambiguous))
                .collect::<Vec<_>>(),
        )
        .bind(
            news()
                .map(|n| n.policy.deadline.map(interval))
                .collect::<Vec<_>>(),
        )
        .bind(news().map(|n| interval(n.retention)).collect::<Vec<_>>())
        .bind(news().map(|n| n.acceptance.as_str()).collect::<Vec<_>>())
        .bind(news().map(|n| n.handoff).collect::<Vec<_>>())
        .bind(
            news()
                .map(|n| n.trace_context.as_ref().map(ToString::to_string))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut by_n: HashMap<i64, PgRow> = HashMap::with_capacity(rows.len());
    for row in rows {
        by_n.insert(row.try_get("n").map_err(db)?, row);
    }
    let mut out = Vec::with_capacity(round.len());
    for ((n, (place, new)), id) in (1_i64..).zip(round).zip(ids) {
        let answer = match by_n.remove(&n) {
            Some(row) if row.try_get::<bool, _>("created").map_err(db)? => {
                let created_at = row.try_get("created_at").map_err(db)?;
                let expires_at = row.try_get("expires_at").map_err(db)?;
                Ok(Submitted::Created(new_task(id, new, created_at, expires_at)))
            }
            Some(row) => found(row::task(&row).map_err(db)?, &new),
            // Taken by an insert this statement's snapshot did not see.
            None => submit(sql, conn, new).await,
        };
        out.push((place, submission_answer(answer)?));
    }
    Ok(out)
}

/// One statement (see `claim_next` in `sql`): the leases it took, in due
/// order; a task it failed for a spent budget is not among them. While a
/// task naming a limit is unfinished the statement takes nothing and says
/// so, and the limits decide ([`super::limits::claim_next`]).
pub(crate) async fn claim_next(
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
        .bind(interval(request.lease_duration))
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
        if row.try_get::<Option<uuid::Uuid>, _>("id").map_err(db)?.is_none() {
            // Nothing taken: the one row says whether limits must decide.
            if row.try_get::<bool, _>("limited").map_err(db)? {
                return super::limits::claim_next(sql, conn, &request).await;
            }
            break;
        }
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
pub(crate) async fn renew_many(
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
        .bind(
            leases
                .iter()
                .map(|l| l.attempt_id().as_uuid())
                .collect::<Vec<_>>(),
        )
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
        .filter(|l| !until.contains_key(&l.task_id()))
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
        let (task, now, recorded) = reread_row(&row)?;
        answers.push(
            match rules::check_lease(rules::fence, &task, lease, recorded, now) {
                Err(rejection) => Fenced::Rejected(rejection),
                // Acceptable on the re-read: the row changed in between; renew it alone.
                Ok(()) => renew(sql, conn, lease, extend_by).await?,
            },
        );
    }
    Ok(answers)
}

/// One statement for the whole batch (see `complete_many` in `sql`),
/// and one read of the refused rows to say why each was refused.
pub(crate) async fn complete_many(
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
        .bind(
            completions
                .iter()
                .map(|(l, _)| l.attempt_id().as_uuid())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    let mut saved = rows_by_id(rows)?;
    let refused: Vec<_> = completions
        .iter()
        .map(|(l, _)| l)
        .filter(|l| !saved.contains_key(&l.task_id()))
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
        let (task, now, recorded) = reread_row(&row)?;
        out.push(
            match rules::check_lease(rules::accept, &task, &lease, recorded, now) {
                Err(rejection) => Ok(Fenced::Rejected(rejection)),
                // The row changed between the write and the read: decide it alone.
                Ok(()) => match complete(sql, conn, lease, response).await {
                    Err(Error::NotFound(id)) => Err(Error::NotFound(id)),
                    other => Ok(other?),
                },
            },
        );
    }
    Ok(out)
}

/// The rows of a batch's refused leases with the store clock and each
/// lease's recorded attempt (`read_many`), by id, to say why each was
/// refused; no round trip when none was.
async fn read_refused(
    sql: &Statements,
    conn: &mut PgConnection,
    refused: &[&Lease],
) -> Result<HashMap<TaskId, PgRow>> {
    if refused.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = sql
        .read_many
        .query()
        .bind(refused.iter().map(|l| l.task_id().as_uuid()).collect::<Vec<_>>())
        .bind(refused.iter().map(|l| version(l)).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?;
    rows_by_id(rows)
}

/// A re-read row of a refused lease: the task, the store clock, and the
/// attempt recorded at the lease's version.
fn reread_row(row: &PgRow) -> Result<(Task, OffsetDateTime, Option<AttemptId>)> {
    let task = row::task(row).map_err(db)?;
    let now = row.try_get("store_now").map_err(db)?;
    let recorded: Option<uuid::Uuid> = row.try_get("recorded_attempt").map_err(db)?;
    Ok((task, now, recorded.map(AttemptId::from_uuid)))
}

/// Rows of a batch statement by task id (with the store clock, when read).
fn rows_by_id(rows: Vec<PgRow>) -> Result<HashMap<TaskId, PgRow>> {
    rows.into_iter()
        .map(|row| Ok((TaskId::from_uuid(row.try_get("id").map_err(db)?), row)))
        .collect()
}
