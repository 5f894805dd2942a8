//! Batches: each item decided on its own exactly as the single operation
//! decides it, the whole batch in one transaction (one commit).

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;

use crate::backend::rules;
use crate::backend::submission_answer;
use crate::error::{Error, Result};
use crate::store::{Claim, ClaimNext, ClaimRequest, Fenced, Lease, Submitted};
use crate::task::{AttemptId, NewTask, Response, Task, TaskId};

use super::super::{db, row, sql};
use super::limits::Limits;
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

/// The tasks that need a worker at `now` (never claimed, backoff passed or
/// released, lease expired), of the operations and scopes asked for, each
/// claimed as `claim` would; a spent budget fails its task instead of
/// handing it out. The write lock makes every caller see the previous
/// one's claims: no task is handed out twice.
///
/// Tasks over their key's limit or waiting for a token are skipped in the
/// scan, not claimed and released, and take no place in the batch; the
/// rest are offered round-robin by concurrency key
/// ([`rules::fair_order`]). The scan sees the limits as they stood when
/// it ran; each claim is then decided on them with the batch's own earlier
/// claims counted in (a key filled up by this batch refuses the rest of
/// its tasks, which are skipped the same way), and when such refusals
/// leave the batch short, the batch's writes are made and the scan runs
/// again. With no task naming a key unfinished, the scan is the plain
/// oldest-due-first one, each branch a range scan of its partial index;
/// otherwise it ranks every due task of the filters asked for.
pub(crate) async fn claim_next(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    request: &ClaimNext,
) -> Result<Vec<Lease>> {
    let claim = request.request();
    let mut writes = Writes::default();
    let mut limits = Limits::default();
    let mut leases = Vec::with_capacity(request.limit);
    loop {
        let keyed: bool = sqlx::query_scalar(sql::ANY_KEY_UNFINISHED)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        // With keys, room for the candidates a key filled up by this batch refuses.
        let page = if keyed {
            request.limit.saturating_mul(2).saturating_add(8)
        } else {
            request.limit
        };
        let ids = needing_worker(conn, now, request, keyed, page).await?;
        let mut tasks = read_tasks(conn, &ids).await?;
        // The scan's order, as the rule every backend shares decides it.
        let due: Vec<(&Task, OffsetDateTime)> = tasks
            .iter()
            .filter_map(|task| rules::due_since(task, now).map(|since| (task, since)))
            .collect();
        let order: Vec<TaskId> = rules::fair_order(&due).into_iter().map(|i| due[i].0.id).collect();
        let mut progress = false;
        for id in order {
            if leases.len() == request.limit {
                break;
            }
            let Some(at) = tasks.iter().position(|t| t.id == id) else {
                continue;
            };
            let task = tasks.swap_remove(at);
            match super::claim_task(conn, now, task, &claim, &mut writes, &mut limits).await? {
                Claim::Acquired(lease) => {
                    leases.push(lease);
                    progress = true;
                }
                Claim::Throttled(_) => {}
                _ => progress = true,
            }
        }
        if leases.len() == request.limit || ids.len() < page || !progress {
            break;
        }
        // Short of the limit with candidates left: the scan again, on the
        // limits as this batch left them.
        std::mem::take(&mut writes).flush(conn, now).await?;
    }
    writes.flush(conn, now).await?;
    Ok(leases)
}

/// Up to `limit` ids of tasks needing a worker at `now`, of the request's
/// operations and scopes, skipping those their limits refuse at `now`, in
/// offering order; `keyed`: some task naming a concurrency key is unfinished.
async fn needing_worker(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    request: &ClaimNext,
    keyed: bool,
    limit: usize,
) -> Result<Vec<TaskId>> {
    // ?1 now, ?2 limit, then the operations and the scopes.
    let mut filter = String::new();
    let mut next = 3;
    for (column, names) in [("operation", &request.operations), ("scope", &request.scopes)] {
        if !names.is_empty() {
            let marks: Vec<String> = (next..next + names.len()).map(|n| format!("?{n}")).collect();
            next += names.len();
            filter.push_str(&format!(" AND tasks.{column} IN ({})", marks.join(", ")));
        }
    }
    filter.push_str(sql::HAS_TOKEN);
    let scan = if keyed {
        sql::NEEDING_WORKER_FAIR
    } else {
        sql::NEEDING_WORKER
    };
    let statement = scan.replace("{filter}", &filter);
    let mut q = sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(row::at(now))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    for name in request.operations.iter().chain(request.scopes.iter()) {
        q = q.bind(name.as_str());
    }
    q.fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.try_get(0).map(TaskId::from_uuid))
        .collect::<Result<_, _>>()
        .map_err(db)
}

/// The rows of the tasks `ids`, in chunks of [`ROWS_PER_STATEMENT`].
async fn read_tasks(conn: &mut SqliteConnection, ids: &[TaskId]) -> Result<Vec<Task>> {
    let mut tasks = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(ROWS_PER_STATEMENT) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let mut read = sqlx::query(sqlx::AssertSqlSafe(sql::TASKS.replace("{ids}", &marks)));
        for id in chunk {
            read = read.bind(id.as_uuid());
        }
        for r in read.fetch_all(&mut *conn).await.map_err(db)? {
            tasks.push(row::task(&r).map_err(db)?);
        }
    }
    Ok(tasks)
}
