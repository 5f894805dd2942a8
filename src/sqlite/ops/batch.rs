//! Batches: each item decided on its own exactly as the single operation
//! decides it, the whole batch in one transaction (one commit).

use std::time::Duration;

use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;

use crate::backend::submission_answer;
use crate::error::{Error, Result};
use crate::store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease, Submitted};
use crate::task::{NewTask, Response, Task, TaskId};

use super::super::{db, row, sql};

/// Each task submitted as `submit` would, in order; each one's refusal
/// (a key conflict) is its own item.
pub(crate) async fn submit_many(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    tasks: Vec<NewTask>,
) -> Result<Vec<Result<Submitted>>> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(submission_answer(super::submit(conn, now, task).await)?);
    }
    Ok(out)
}

/// Each id claimed as `claim` would, in order.
pub(crate) async fn claim_many(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    ids: &[TaskId],
    request: &ClaimRequest,
) -> Result<Vec<Claim>> {
    let mut claims = Vec::with_capacity(ids.len());
    for &id in ids {
        claims.push(super::claim(conn, now, id, request).await?);
    }
    Ok(claims)
}

/// Each lease completed as `complete` would; a task that is gone is that
/// item's [`Error::NotFound`].
pub(crate) async fn complete_many(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    completions: Vec<(Lease, Response)>,
) -> Result<Vec<Result<Fenced<Task>>>> {
    let mut out = Vec::with_capacity(completions.len());
    for (lease, response) in completions {
        match super::complete(conn, now, &lease, response).await {
            Err(Error::NotFound(id)) => out.push(Err(Error::NotFound(id))),
            Err(e) => return Err(e),
            Ok(fenced) => out.push(Ok(fenced)),
        }
    }
    Ok(out)
}

/// Each lease renewed as `renew` would.
pub(crate) async fn renew_many(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    leases: &mut [Lease],
    extend_by: Duration,
) -> Result<Vec<Fenced<()>>> {
    let mut out = Vec::with_capacity(leases.len());
    for lease in leases {
        out.push(super::renew(conn, now, lease, extend_by).await?);
    }
    Ok(out)
}

/// The store as the queue: the tasks that need a worker, oldest due first
/// ([`rules::due_since`](crate::backend::rules::due_since) in SQL, each
/// branch a range scan of its partial index), of the operations and scopes
/// asked for, each claimed as `claim` would; a spent budget fails its task
/// instead of handing it out. The write lock makes every caller see the
/// previous one's claims: no task is handed out twice.
pub(crate) async fn claim_next(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    request: &ClaimNext,
) -> Result<Vec<Lease>> {
    let mut filter = String::new();
    for (column, names) in [("operation", &request.operations), ("scope", &request.scopes)] {
        if !names.is_empty() {
            let marks = vec!["?"; names.len()].join(", ");
            filter.push_str(&format!(" AND {column} IN ({marks})"));
        }
    }
    // The same filter in each of the three branches: its values bound three times, in order.
    // Anonymous parameters, bound in the order they appear.
    let statement = sql::NEEDING_WORKER
        .replace("{filter}", &filter)
        .replace("?1", "?")
        .replace("?2", "?");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(statement));
    let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
    let filter_values = || {
        request
            .operations
            .iter()
            .chain(request.scopes.iter())
            .cloned()
            .collect::<Vec<String>>()
    };
    // Branch 1: filter, limit. Branch 2: now, filter, limit. Branch 3: now, filter, limit. Then limit.
    for v in filter_values() {
        q = q.bind(v);
    }
    q = q.bind(limit);
    for _ in 0..2 {
        q = q.bind(row::at(now));
        for v in filter_values() {
            q = q.bind(v);
        }
        q = q.bind(limit);
    }
    q = q.bind(limit);
    let ids: Vec<TaskId> = q
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.try_get(0).map(TaskId::from_uuid))
        .collect::<Result<_, _>>()
        .map_err(db)?;
    let claim = request.request();
    let mut leases = Vec::with_capacity(ids.len());
    for id in ids {
        if let Claim::Acquired(lease) = super::claim(conn, now, id, &claim).await? {
            leases.push(lease);
        }
    }
    Ok(leases)
}
