//! Batches: one statement for the whole batch, one read of the refused rows;
//! a task whose row changed meanwhile is decided again on its own.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use time::OffsetDateTime;

use crate::backend::renewed;
use crate::backend::rules::{self, ClaimRule};
use crate::error::{Error, Result};
use crate::policy::StopReason;
use crate::store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease};
use crate::task::{AttemptId, Response, Task, TaskId};

use super::fenced::{Raced, version};
use super::single::{claim, complete, renew, written_claim};
use crate::postgres::db;
use crate::postgres::row::{self, interval};
use crate::postgres::sql::Statements;

/// One statement for the whole batch (see `claim_many` in `sql.rs`); a
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

/// One statement (see `claim_next` in `sql.rs`): the leases it took, in due
/// order; a task it failed for a spent budget is not among them.
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

/// One statement for the whole batch (see `complete_many` in `sql.rs`),
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
