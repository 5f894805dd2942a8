//! The operator's queries (plans at 10⁶ rows in `docs/POSTGRES.md`):
//! listings are keyset pages on the primary key's order, one statement per
//! combination of filters; counting one scope reads that scope's index
//! entries, counting all reads every entry of one index.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgConnection;

use crate::error::{Error, Result};
use crate::inspect::{Counts, Order, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::task::{Status, TaskId};

use crate::postgres::db;
use crate::postgres::row::{self, interval};
use crate::postgres::sql::{ListShape, Statements};

pub(crate) async fn list(sql: &Statements, conn: &mut PgConnection, query: &TaskQuery) -> Result<Page> {
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
    Ok(Page::from_overfetch(
        super::super::reads::summaries(&rows)?,
        query.limit,
    ))
}

pub(crate) async fn counts(sql: &Statements, conn: &mut PgConnection, scope: Option<&str>) -> Result<Counts> {
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

pub(crate) async fn depth(sql: &Statements, conn: &mut PgConnection) -> Result<Vec<QueueDepth>> {
    let rows = sql.depth.query().fetch_all(conn).await.map_err(db)?;
    let count = |row: &sqlx::postgres::PgRow, column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(db)?;
        Ok(u64::try_from(n).unwrap_or_default())
    };
    rows.iter()
        .map(|row| {
            let mut queue = QueueDepth::new(row.try_get::<String, _>("operation").map_err(db)?);
            queue.due = count(row, "due")?;
            queue.scheduled = count(row, "scheduled")?;
            queue.running = count(row, "running")?;
            queue.oldest_due_at = row.try_get("oldest_due_at").map_err(db)?;
            Ok(queue)
        })
        .collect()
}

pub(crate) async fn story(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Option<Story>> {
    sql.story
        .query()
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|row| row::story(&row).map_err(db))
        .transpose()
}

pub(crate) async fn stranded(
    sql: &Statements,
    conn: &mut PgConnection,
    older_than: Duration,
    limit: usize,
) -> Result<Vec<TaskSummary>> {
    let rows = sql
        .stranded
        .query()
        .bind(interval(older_than))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    super::super::reads::summaries(&rows)
}

/// The bound that precedes (newest first) or follows (oldest first) every
/// task id: the cursor of a first page. UUID v7 ids never take either value.
fn open_cursor(order: Order) -> uuid::Uuid {
    match order {
        Order::NewestFirst => uuid::Uuid::max(),
        Order::OldestFirst => uuid::Uuid::nil(),
    }
}
