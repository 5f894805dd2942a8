//! The store's upkeep across tasks: due tasks, the retention purge, fresh
//! handoffs for stranded tasks.

use sqlx::Row;
use sqlx::postgres::PgConnection;

use crate::error::Result;
use crate::task::TaskId;

use crate::postgres::db;
use crate::postgres::sql::Statements;

pub(crate) async fn due(sql: &Statements, conn: &mut PgConnection, limit: usize) -> Result<Vec<TaskId>> {
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

pub(crate) async fn purge_expired(sql: &Statements, conn: &mut PgConnection, limit: usize) -> Result<u64> {
    let done = sql
        .purge_expired
        .query()
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(done.rows_affected())
}

/// Writes a fresh, unpublished handoff for each of `ids` still pending.
pub(crate) async fn redispatch(sql: &Statements, conn: &mut PgConnection, ids: &[TaskId]) -> Result<u64> {
    let done = sql
        .redispatch
        .query()
        .bind(ids.iter().map(|id| id.as_uuid()).collect::<Vec<_>>())
        .execute(conn)
        .await
        .map_err(db)?;
    Ok(done.rows_affected())
}
