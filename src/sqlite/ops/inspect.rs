//! The operator's queries: keyset pages in id order, counts, a task's
//! whole story, stranded tasks.

use std::time::Duration;

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;

use crate::error::Result;
use crate::inspect::{
    CappedCounts, Count, Counts, Order, Page, QueueDepth, STATUSES, Story, TaskQuery, TaskSummary,
};
use crate::task::{Status, TaskId};

use super::super::{db, row, sql};

/// One page of tasks matching `query`, in id order after its cursor.
pub(crate) async fn list(conn: &mut SqliteConnection, query: &TaskQuery) -> Result<Page> {
    let (cursor_op, order) = match query.order {
        Order::OldestFirst => (">", "ASC"),
        Order::NewestFirst => ("<", "DESC"),
    };
    let statement = format!(
        "SELECT {} FROM tasks
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR scope = ?2) AND (?3 IS NULL OR operation = ?3)
           AND (?4 IS NULL OR created_at >= ?4) AND (?5 IS NULL OR created_at < ?5)
           AND (?6 IS NULL OR id {cursor_op} ?6)
         ORDER BY id {order} LIMIT ?7",
        sql::SUMMARY_COLUMNS
    );
    let tasks = sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(query.status.map(Status::as_str))
        .bind(query.scope.as_deref())
        .bind(query.operation.as_deref())
        .bind(row::at_opt(query.created_after))
        .bind(row::at_opt(query.created_before))
        .bind(query.after.map(|c| c.task_id().as_uuid()))
        .bind(i64::try_from(query.limit + 1).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    Ok(Page::from_overfetch(summaries(&tasks)?, query.limit))
}

/// Tasks by status, of one scope or all.
pub(crate) async fn counts(conn: &mut SqliteConnection, scope: Option<&str>) -> Result<Counts> {
    let mut counts = Counts::default();
    for r in sqlx::query(sql::COUNTS)
        .bind(scope)
        .fetch_all(conn)
        .await
        .map_err(db)?
    {
        let status: String = r.try_get(0).map_err(db)?;
        let n: i64 = r.try_get(1).map_err(db)?;
        let status = status.parse::<Status>().map_err(crate::Error::storage)?;
        counts.add(status, u64::try_from(n).unwrap_or(0));
    }
    Ok(counts)
}

/// Each status counted up to `cap`: each count stops after `cap` rows.
pub(crate) async fn counts_up_to(
    conn: &mut SqliteConnection,
    scope: Option<&str>,
    cap: u64,
) -> Result<CappedCounts> {
    let mut counts = CappedCounts::default();
    for status in STATUSES {
        let n: i64 = sqlx::query_scalar(sql::COUNT_UP_TO)
            .bind(status.as_str())
            .bind(scope)
            .bind(row::int(cap))
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        counts.set(status, Count::up_to(u64::try_from(n).unwrap_or(0), cap));
    }
    Ok(counts)
}

/// The task with its attempts, reopenings, handoffs and effects (one read transaction: one snapshot).
pub(crate) async fn story(conn: &mut SqliteConnection, id: TaskId) -> Result<Option<Story>> {
    let Some(task) = super::row_io::load(conn, id).await? else {
        return Ok(None);
    };
    let attempts = super::attempts(conn, id).await?;
    let reopenings = sqlx::query(sql::REOPENINGS)
        .bind(id.as_uuid())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::reopening)
        .collect::<Result<Vec<_>, _>>()
        .map_err(db)?;
    let handoffs = sqlx::query(sql::HANDOFFS)
        .bind(id.as_uuid())
        .fetch_all(&mut *conn)
        .await
        .map_err(db)?
        .iter()
        .map(row::handoff)
        .collect::<Result<Vec<_>, _>>()
        .map_err(db)?;
    let effects = super::effects(conn, id).await?;
    Ok(Some(
        Story::new(task, attempts, reopenings, handoffs).with_effects(effects),
    ))
}

/// Never-claimed pending tasks handed off before `now - older_than` and not published since.
pub(crate) async fn stranded(
    conn: &mut SqliteConnection,
    now: OffsetDateTime,
    older_than: Duration,
    limit: usize,
) -> Result<Vec<TaskSummary>> {
    let statement = sql::STRANDED.replace("{cols}", sql::SUMMARY_COLUMNS);
    let rows = sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(row::at(now - older_than))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    summaries(&rows)
}

/// Each operation's queue at `now`: the live tasks read in one statement,
/// tallied as every backend tallies them.
pub(crate) async fn depth(conn: &mut SqliteConnection, now: OffsetDateTime) -> Result<Vec<QueueDepth>> {
    let statement = sql::LIVE.replace("{cols}", sql::SUMMARY_COLUMNS);
    let rows = sqlx::query(sqlx::AssertSqlSafe(statement))
        .fetch_all(conn)
        .await
        .map_err(db)?;
    Ok(QueueDepth::tally(&summaries(&rows)?, now))
}

/// Rows of [`sql::SUMMARY_COLUMNS`] as summaries.
fn summaries(rows: &[SqliteRow]) -> Result<Vec<TaskSummary>> {
    rows.iter()
        .map(row::summary)
        .collect::<Result<_, _>>()
        .map_err(db)
}
