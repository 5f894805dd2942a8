//! Batches: each item decided on its own exactly as the single operation
//! decides it, the whole batch in one transaction (one commit).

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;

use crate::backend::submission_answer;
use crate::error::{Error, Result};
use crate::store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease, Submitted};
use crate::task::{AttemptId, NewTask, Response, Task, TaskId};

use super::super::{db, row, sql};
use super::row_io::{ROWS_PER_STATEMENT, Writes, with_attempt};

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
/// item's [`Error::NotFound`]. A batch names each task once (checked at
/// entry), so the items are independent: their rows are read at once,
/// each decided alone, and written at once ([`Writes`]).
pub(crate) async fn complete_many(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    completions: Vec<(Lease, Response)>,
) -> Result<Vec<Result<Fenced<Task>>>> {
    let asked: Vec<(TaskId, u64)> = completions
        .iter()
        .map(|(lease, _)| (lease.task_id(), lease.version()))
        .collect();
    let mut tasks: HashMap<TaskId, Task> = HashMap::new();
    let mut recorded: HashMap<(TaskId, u64), Option<AttemptId>> = HashMap::new();
    for chunk in asked.chunks(ROWS_PER_STATEMENT) {
        let marks = vec!["(?, ?)"; chunk.len()].join(", ");
        let mut read = sqlx::query(sqlx::AssertSqlSafe(
            sql::TASKS_WITH_ATTEMPTS.replace("{rows}", &marks),
        ));
        for (id, version) in chunk {
            read = read.bind(id.as_uuid()).bind(row::int(*version));
        }
        for r in read.fetch_all(&mut *conn).await.map_err(db)? {
            let (task, attempt) = with_attempt(&r).map_err(db)?;
            let version: i64 = r.try_get("lease_version").map_err(db)?;
            recorded.insert((task.id, u64::try_from(version).unwrap_or_default()), attempt);
            tasks.insert(task.id, task);
        }
    }
    let mut writes = Writes::default();
    let mut out = Vec::with_capacity(completions.len());
    for (lease, response) in completions {
        let id = lease.task_id();
        let Some(task) = tasks.remove(&id) else {
            out.push(Err(Error::NotFound(id)));
            continue;
        };
        let attempt = recorded.get(&(id, lease.version())).copied().flatten();
        out.push(Ok(super::decide_complete(
            now,
            task,
            attempt,
            &lease,
            response,
            &mut writes,
        )));
    }
    writes.flush(conn, now).await?;
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
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // Their rows in one read, then each claimed in the order found.
    let marks = vec!["?"; ids.len()].join(", ");
    let mut read = sqlx::query(sqlx::AssertSqlSafe(sql::TASKS.replace("{ids}", &marks)));
    for id in &ids {
        read = read.bind(id.as_uuid());
    }
    let mut tasks: HashMap<TaskId, Task> = read
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| row::task(r).map(|t| (t.id, t)))
        .collect::<Result<_, _>>()
        .map_err(db)?;
    let claim = request.request();
    let mut writes = Writes::default();
    let mut leases = Vec::with_capacity(ids.len());
    for id in ids {
        let Some(task) = tasks.remove(&id) else {
            continue;
        };
        if let Claim::Acquired(lease) = super::decide_claim(now, task, &claim, &mut writes) {
            leases.push(lease);
        }
    }
    writes.flush(conn, now).await?;
    Ok(leases)
}
