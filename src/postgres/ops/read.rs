//! One task's reads: by id, by request key, its attempts.

use sqlx::postgres::PgConnection;

use crate::error::Result;
use crate::store::Attempt;
use crate::task::{RequestKey, Task, TaskId};

use crate::postgres::db;
use crate::postgres::row;
use crate::postgres::sql::Statements;

pub(crate) async fn get(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Option<Task>> {
    sql.get
        .query()
        .bind(id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(db)?
        .map(|row| row::task(&row).map_err(db))
        .transpose()
}

pub(crate) async fn find(
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

pub(crate) async fn attempts(sql: &Statements, conn: &mut PgConnection, id: TaskId) -> Result<Vec<Attempt>> {
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
